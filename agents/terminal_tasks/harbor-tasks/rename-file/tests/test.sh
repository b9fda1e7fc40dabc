#!/bin/bash
# Reward 1 iff /app/final.md holds the draft's content and /app/draft.md is gone; else 0.
if [ ! -e /app/draft.md ] && cmp -s /app/final.md /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

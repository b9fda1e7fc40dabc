#!/bin/bash
# Reward 1 iff /app/unique.txt holds each word once, sorted; else 0.
if cmp -s /app/unique.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

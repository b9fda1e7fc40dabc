#!/bin/bash
# Reward 1 iff /app/reversed.txt holds the steps last to first; else 0.
if cmp -s /app/reversed.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

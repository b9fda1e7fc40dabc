#!/bin/bash
# Reward 1 iff /app/recent.txt holds the last two commands; else 0.
if cmp -s /app/recent.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

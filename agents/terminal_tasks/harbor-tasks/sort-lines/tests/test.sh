#!/bin/bash
# Reward 1 iff /app/sorted.txt holds the names in alphabetical order; else 0.
if cmp -s /app/sorted.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

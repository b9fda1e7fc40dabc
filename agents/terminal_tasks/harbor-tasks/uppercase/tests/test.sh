#!/bin/bash
# Reward 1 iff /app/upper.txt is /app/input.txt in upper case; else 0.
if cmp -s /app/upper.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

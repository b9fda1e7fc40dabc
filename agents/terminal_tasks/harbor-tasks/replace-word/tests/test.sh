#!/bin/bash
# Reward 1 iff /app/config.txt names 127.0.0.1 wherever it said localhost; else 0.
if cmp -s /app/config.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

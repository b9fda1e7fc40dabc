#!/bin/bash
# Reward 1 iff /app/cities.txt holds the cities; else 0.
if cmp -s /app/cities.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

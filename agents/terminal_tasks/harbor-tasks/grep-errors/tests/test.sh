#!/bin/bash
# Reward 1 iff /app/errors.log holds the ERROR lines in order; else 0.
if cmp -s /app/errors.log /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

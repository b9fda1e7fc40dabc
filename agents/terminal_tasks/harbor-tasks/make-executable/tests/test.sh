#!/bin/bash
# Reward 1 iff /app/run.sh is executable and unchanged; else 0.
if [ -x /app/run.sh ] && cmp -s /app/run.sh /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

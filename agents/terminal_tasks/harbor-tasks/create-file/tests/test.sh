#!/bin/bash
# Reward 1 iff /app/hello.txt holds exactly the line `Hello, world!`; else 0.
if cmp -s /app/hello.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

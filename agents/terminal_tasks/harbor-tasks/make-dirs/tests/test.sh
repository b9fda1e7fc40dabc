#!/bin/bash
# Reward 1 iff /app/build/output/logs is a directory; else 0.
if [ -d /app/build/output/logs ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

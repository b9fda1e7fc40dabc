#!/bin/bash
# Reward 1 iff /app/words.txt holds 19; else 0.
if [ "$(tr -d " \n\t" < /app/words.txt 2>/dev/null)" = "19" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

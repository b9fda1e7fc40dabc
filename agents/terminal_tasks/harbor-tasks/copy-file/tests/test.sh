#!/bin/bash
# Reward 1 iff both /app/config/settings.ini and /app/backup/settings.ini hold the settings; else 0.
if cmp -s /app/backup/settings.ini /tests/expected && cmp -s /app/config/settings.ini /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

#!/bin/bash
set -e
cd /app
mv draft.md final.md

#!/bin/bash
set -e
cd /app
wc -w < essay.txt > words.txt

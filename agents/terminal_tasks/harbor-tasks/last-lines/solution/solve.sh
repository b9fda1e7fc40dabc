#!/bin/bash
set -e
cd /app
tail -n 2 history.txt > recent.txt

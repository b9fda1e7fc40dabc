#!/bin/bash
set -e
cd /app
tail -n +2 people.csv | cut -d, -f3 > cities.txt

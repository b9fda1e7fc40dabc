#!/bin/bash
set -e
cd /app
tr a-z A-Z < input.txt > upper.txt

#!/bin/bash
set -e
cd /app
grep -c GET access.log > gets.txt

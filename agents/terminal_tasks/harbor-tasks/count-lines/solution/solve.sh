#!/bin/bash
set -e
cd /app
wc -l < data.txt > count.txt

#!/bin/bash
set -e
cd /app
head -n 3 log.txt > top.txt

#!/bin/bash
set -e
cd /app
sort -u words.txt > unique.txt

#!/bin/bash
set -e
cd /app
sort names.txt > sorted.txt

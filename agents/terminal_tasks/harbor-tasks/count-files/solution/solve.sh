#!/bin/bash
set -e
cd /app
find src -name '*.py' | wc -l > n_py.txt

#!/bin/bash
set -e
cd /app
tac steps.txt > reversed.txt

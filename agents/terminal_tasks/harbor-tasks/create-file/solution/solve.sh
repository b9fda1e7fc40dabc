#!/bin/bash
set -e
cd /app
echo 'Hello, world!' > hello.txt

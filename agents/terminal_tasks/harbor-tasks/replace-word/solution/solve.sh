#!/bin/bash
set -e
cd /app
sed -i 's/localhost/127.0.0.1/g' config.txt

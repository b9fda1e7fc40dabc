#!/bin/bash
set -e
cd /app
mkdir -p build/output/logs

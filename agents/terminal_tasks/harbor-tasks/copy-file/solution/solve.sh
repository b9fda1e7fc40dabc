#!/bin/bash
set -e
cd /app
mkdir -p backup && cp config/settings.ini backup/

#!/bin/bash
set -e
cd /app
grep ERROR app.log > errors.log

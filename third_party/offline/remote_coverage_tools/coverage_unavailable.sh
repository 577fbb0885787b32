#!/bin/sh
# Offline stand-in: the real coverage tools cannot be downloaded here.
echo "bazel coverage is not available in the offline Bazel 4 setup (see docs/building.md)" >&2
exit 1

#!/usr/bin/env bash
# Print the newest Python >= 3.12 found (PATH, then pyenv), or nothing. Django 6 needs >= 3.12.
best=""; best_v=0
for py in python3.14 python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python; do
    path="$(command -v "$py" 2>/dev/null)" || continue
    v="$("$path" -c 'import sys; print(sys.version_info[0] * 100 + sys.version_info[1])' 2>/dev/null)" || continue
    if [ "$v" -ge 312 ] && [ "$v" -gt "$best_v" ]; then best="$path"; best_v="$v"; fi
done
echo "$best"

cd "$(dirname "$0")"
nvcc -o capture_probe capture_probe.cu || exit 1
./capture_probe > $OUT/capture_probe.log 2>&1; echo "rc=$?" >> $OUT/capture_probe.log
cat $OUT/capture_probe.log

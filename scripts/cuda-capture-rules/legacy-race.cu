// Plain CUDA, no gpumem: a thread begins and ends captures of a blocking stream (the per-thread
// default stream, argument 0, or a created one, 1) while two threads queue legacy-stream work
// (argument 0: cudaMemset, 1: cudaStreamIsCapturing(0), 2: cudaStreamQuery(0)). Driver 580.159
// (CUDA 13, H200) crashed with a segmentation fault in every run with cudaMemset or
// cudaStreamQuery, and never with cudaStreamIsCapturing; backend-cuda/src/legacy.rs keeps
// gpumem's own calls out of that state. run.sh builds and runs it.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <atomic>
static std::atomic<int> stop_flag(0);
static void CUDART_CB hf(void*){}
static int lmode;
static void* legacy(void* d){ cudaStreamCaptureStatus st; while(!stop_flag.load()){ cudaError_t e = lmode==0 ? cudaMemset(d, 1, 65536) : lmode==1 ? cudaStreamIsCapturing(0, &st) : cudaStreamQuery(0); if (e) cudaGetLastError(); } return 0; }
int main(int argc, char** argv){
  setvbuf(stdout,NULL,_IONBF,0);
  int hostfn = 0; int smode = atoi(argv[1]); lmode = atoi(argv[2]);
  cudaStream_t S = cudaStreamPerThread; if (smode == 1) cudaStreamCreate(&S);
  void *d, *d2; cudaMalloc(&d, 65536); cudaMalloc(&d2, 65536);
  pthread_t l1, l2; pthread_create(&l1, 0, legacy, d2); pthread_create(&l2, 0, legacy, d2);
  int ok=0, fail=0;
  for (int i=0;i<200;i++){
    if (cudaStreamBeginCapture(S, cudaStreamCaptureModeRelaxed)) { cudaGetLastError(); continue; }
    if (hostfn) cudaLaunchHostFunc(S, hf, 0);
    cudaMemsetAsync(d, 2, 65536, S);
    cudaGraph_t g = 0;
    if (cudaStreamEndCapture(S, &g) == 0 && g) { ok++; cudaGraphDestroy(g); } else { fail++; cudaGetLastError(); }
  }
  stop_flag.store(1); pthread_join(l1,0); pthread_join(l2,0);
  printf("captures ok %d failed %d; sync -> %d\n", ok, fail, (int)cudaDeviceSynchronize());
  return 0;
}

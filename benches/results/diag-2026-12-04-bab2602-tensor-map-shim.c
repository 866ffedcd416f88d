// LD_PRELOAD shim (diagnostic, not for main): logs every cuTensorMapEncodeTiled call,
// including those cuBLASLt makes through cuGetProcAddress, to $TMAP_LOG (or stderr).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef CUresult (*encode_fn)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                              const uint32_t *, const uint32_t *, int, int, int, int);
typedef CUresult (*gpa1_fn)(const char *, void **, int, uint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, uint64_t, void *);
typedef void *(*dlsym_fn)(void *, const char *);
static encode_fn real_encode;
static gpa1_fn real_gpa1;
static gpa2_fn real_gpa2;
static dlsym_fn real_dlsym_p;
static void *real_dlsym(void *h, const char *n) {
  if (!real_dlsym_p) {
    real_dlsym_p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym_p) real_dlsym_p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  }
  return real_dlsym_p(h, n);
}
static FILE *logf_(void) {
  static FILE *f;
  if (!f) {
    const char *p = getenv("TMAP_LOG");
    f = p ? fopen(p, "a") : stderr;
    if (!f) f = stderr;
  }
  return f;
}
static CUresult my_encode(void *map, int dtype, uint32_t rank, void *addr, const uint64_t *dims,
                          const uint64_t *strides, const uint32_t *box, const uint32_t *estr,
                          int interleave, int swizzle, int l2, int oob) {
  FILE *f = logf_();
  fprintf(f, "encode dtype=%d rank=%u addr=%p dims=[", dtype, rank, addr);
  for (uint32_t i = 0; i < rank; i++) fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)dims[i]);
  fprintf(f, "] strides=[");
  for (uint32_t i = 0; i + 1 < rank; i++) fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)strides[i]);
  fprintf(f, "] box=[");
  for (uint32_t i = 0; i < rank; i++) fprintf(f, "%s%u", i ? "," : "", box[i]);
  fprintf(f, "] estr=[");
  for (uint32_t i = 0; i < rank; i++) fprintf(f, "%s%u", i ? "," : "", estr[i]);
  fprintf(f, "] interleave=%d swizzle=%d l2promo=%d oobfill=%d\n", interleave, swizzle, l2, oob);
  fflush(f);
  if (!real_encode) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    real_encode = (encode_fn)real_dlsym(h, "cuTensorMapEncodeTiled");
  }
  return real_encode(map, dtype, rank, addr, dims, strides, box, estr, interleave, swizzle, l2, oob);
}
static CUresult my_gpa1(const char *s, void **pfn, int v, uint64_t fl) {
  CUresult r = real_gpa1(s, pfn, v, fl);
  if (r == 0 && s && strcmp(s, "cuTensorMapEncodeTiled") == 0) {
    if (!real_encode) real_encode = (encode_fn)*pfn;
    *pfn = (void *)my_encode;
  }
  return r;
}
static CUresult my_gpa2(const char *s, void **pfn, int v, uint64_t fl, void *st) {
  CUresult r = real_gpa2(s, pfn, v, fl, st);
  if (r == 0 && s && strcmp(s, "cuTensorMapEncodeTiled") == 0) {
    if (!real_encode) real_encode = (encode_fn)*pfn;
    *pfn = (void *)my_encode;
  }
  if (r == 0 && s && strcmp(s, "cuGetProcAddress") == 0) {
    if (!real_gpa1) real_gpa1 = (gpa1_fn)*pfn;
    *pfn = (void *)my_gpa1;
  }
  return r;
}
void *dlsym(void *h, const char *n) {
  void *p = real_dlsym(h, n);
  if (!p || !n) return p;
  if (strcmp(n, "cuTensorMapEncodeTiled") == 0) {
    if (!real_encode) real_encode = (encode_fn)p;
    return (void *)my_encode;
  }
  if (strcmp(n, "cuGetProcAddress_v2") == 0) {
    real_gpa2 = (gpa2_fn)p;
    return (void *)my_gpa2;
  }
  if (strcmp(n, "cuGetProcAddress") == 0) {
    real_gpa1 = (gpa1_fn)p;
    return (void *)my_gpa1;
  }
  return p;
}

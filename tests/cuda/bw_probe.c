/*
 * tests/cuda/bw_probe.c - a short CUDA copy bandwidth probe: HtoD, DtoH and DtoD of one
 * buffer (256 MiB by default) through the cuda/ owners (pinned host memory, device
 * allocations, a copy stream with its event and holds) against cuMemcpy* called directly
 * on the same buffers, a few iterations each, printing GB/s and the owners/direct ratio.
 * Before timing, one round trip (HtoD, DtoD, DtoH) is checked byte for byte.
 *
 *   bw_probe [--size BYTES[K|M|G]] [--iters N] [--device N] [--json]
 *
 * The driver is loaded as everywhere ($OTE_CUDA_LIBRARY or libcuda.so.1). Exit status: 0
 * done, 1 a failure, 2 no CUDA driver or device ("no GPU: ...").
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/time.h"
#include "cuda/driver.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
#include "cuda/stream/stream.h"

#define EXIT_NO_GPU 2

static size_t parse_size(const char *s) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return 0;
    switch (*end) {
        case 'k':
        case 'K':
            v <<= 10;
            end++;
            break;
        case 'm':
        case 'M':
            v <<= 20;
            end++;
            break;
        case 'g':
        case 'G':
            v <<= 30;
            end++;
            break;
        default: break;
    }
    return *end == '\0' ? (size_t)v : 0;
}

typedef struct {
    ote_cuda_device_t *dev;
    const ote_cuda_driver_table_t *t;
    ote_cuda_driver_t *drv;
    ote_cuda_stream_t *stream;
    ote_cuda_host_mem_t *host, *host2;
    ote_cuda_alloc_t *da, *db;
    size_t size;
} probe_t;

static const char *kind_name(ote_cuda_copy_kind_t k) {
    return k == OTE_CUDA_COPY_HTOD ? "HtoD" : k == OTE_CUDA_COPY_DTOH ? "DtoH" : "DtoD";
}

static void endpoints(probe_t *p, ote_cuda_copy_kind_t k, ote_cu_deviceptr_t *dst,
                      ote_cu_deviceptr_t *src) {
    ote_cu_deviceptr_t h = (ote_cu_deviceptr_t)(uintptr_t)ote_cuda_host_mem_ptr(p->host);
    if (k == OTE_CUDA_COPY_HTOD) {
        *dst = ote_cuda_alloc_ptr(p->da);
        *src = h;
    } else if (k == OTE_CUDA_COPY_DTOH) {
        *dst = h;
        *src = ote_cuda_alloc_ptr(p->da);
    } else {
        *dst = ote_cuda_alloc_ptr(p->db);
        *src = ote_cuda_alloc_ptr(p->da);
    }
}

/* One copy through the owners: enqueue, hold what it touches, commit, wait. */
static ote_status_t owner_copy(probe_t *p, ote_cuda_copy_kind_t k) {
    ote_cu_deviceptr_t dst, src;
    endpoints(p, k, &dst, &src);
    ote_status_t st = ote_cuda_stream_hold_alloc(p->stream, p->da);
    if (st == OTE_OK && k == OTE_CUDA_COPY_DTOD) st = ote_cuda_stream_hold_alloc(p->stream, p->db);
    if (st == OTE_OK && k != OTE_CUDA_COPY_DTOD) st = ote_cuda_stream_hold_host(p->stream, p->host);
    if (st == OTE_OK) st = ote_cuda_stream_copy(p->stream, k, dst, src, p->size);
    if (st == OTE_OK) st = ote_cuda_stream_commit(p->stream, NULL, NULL);
    if (st == OTE_OK)
        st = ote_cuda_stream_wait(p->stream, ote_deadline_after(60ull * OTE_NSEC_PER_SEC));
    return st;
}

static ote_status_t direct_copy(probe_t *p, ote_cuda_copy_kind_t k) {
    ote_cu_deviceptr_t dst, src;
    endpoints(p, k, &dst, &src);
    ote_status_t st = ote_cuda_device_make_current(p->dev);
    if (st != OTE_OK) return st;
    ote_cu_result_t res;
    if (k == OTE_CUDA_COPY_HTOD)
        res = p->t->cuMemcpyHtoD(dst, (const void *)(uintptr_t)src, p->size);
    else if (k == OTE_CUDA_COPY_DTOH)
        res = p->t->cuMemcpyDtoH((void *)(uintptr_t)dst, src, p->size);
    else res = p->t->cuMemcpyDtoD(dst, src, p->size); /* fenced by the caller */
    return ote_cuda_check(p->drv, res, kind_name(k));
}

/* DtoD through cuMemcpyDtoD is asynchronous with respect to the host for device memory;
 * a synchronous DtoH of one byte after it orders the measurement on the null stream. */
static ote_status_t direct_fence(probe_t *p) {
    unsigned char b;
    return ote_cuda_check(p->drv, p->t->cuMemcpyDtoH(&b, ote_cuda_alloc_ptr(p->db), 1),
                          "cuMemcpyDtoH(fence)");
}

static ote_status_t check_round_trip(probe_t *p) {
    unsigned char *h = ote_cuda_host_mem_ptr(p->host), *h2 = ote_cuda_host_mem_ptr(p->host2);
    for (size_t i = 0; i < p->size; i++) h[i] = (unsigned char)(i * 131u + (i >> 20) + 7u);
    memset(h2, 0, p->size);
    ote_status_t st = owner_copy(p, OTE_CUDA_COPY_HTOD);
    if (st == OTE_OK) st = owner_copy(p, OTE_CUDA_COPY_DTOD);
    if (st != OTE_OK) return st;
    /* db -> host2 */
    st = ote_cuda_stream_hold_alloc(p->stream, p->db);
    if (st == OTE_OK) st = ote_cuda_stream_hold_host(p->stream, p->host2);
    if (st == OTE_OK)
        st = ote_cuda_stream_copy(p->stream, OTE_CUDA_COPY_DTOH, (ote_cu_deviceptr_t)(uintptr_t)h2,
                                  ote_cuda_alloc_ptr(p->db), p->size);
    if (st == OTE_OK) st = ote_cuda_stream_commit(p->stream, NULL, NULL);
    if (st == OTE_OK)
        st = ote_cuda_stream_wait(p->stream, ote_deadline_after(60ull * OTE_NSEC_PER_SEC));
    if (st != OTE_OK) return st;
    if (memcmp(h, h2, p->size) != 0) {
        fprintf(stderr, "bw_probe: round trip HtoD/DtoD/DtoH returned different bytes\n");
        return OTE_ERR_IO;
    }
    return OTE_OK;
}

int main(int argc, char **argv) {
    size_t size = 256u << 20;
    int iters = 5, ordinal = 0, json = 0;
    static const struct option opts[] = {
        {"size", required_argument, 0, 's'},   {"iters", required_argument, 0, 'i'},
        {"device", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "s:i:d:jh", opts, NULL)) != -1) {
        switch (c) {
            case 's': size = parse_size(optarg); break;
            case 'i': iters = atoi(optarg); break;
            case 'd': ordinal = atoi(optarg); break;
            case 'j': json = 1; break;
            default:
                fprintf(stderr,
                        "usage: %s [--size BYTES[K|M|G]] [--iters N] [--device N] [--json]\n",
                        argv[0]);
                return c == 'h' ? 0 : 1;
        }
    }
    if (size == 0 || iters < 1 || iters > 1000 || ordinal < 0) {
        fprintf(stderr, "bw_probe: --size must be > 0, --iters 1..1000, --device >= 0\n");
        return 1;
    }
    probe_t p = {0};
    p.size = size;
    ote_status_t st = ote_cuda_driver_load(NULL, &p.drv);
    if (st != OTE_OK) {
        printf("no GPU: the CUDA driver did not load (%s)\n", ote_status_str(st));
        return EXIT_NO_GPU;
    }
    int n = 0;
    if (ote_cuda_device_count(p.drv, &n) != OTE_OK || n <= ordinal) {
        printf("no GPU: the driver reports %d device(s)\n", n);
        return EXIT_NO_GPU;
    }
    p.t = ote_cuda_driver_table(p.drv);
    int rc = 1;
    st = ote_cuda_device_open(p.drv, ordinal, &p.dev);
    if (st != OTE_OK) goto out;
    st = ote_cuda_stream_create(p.dev, &p.stream);
    if (st == OTE_OK) st = ote_cuda_host_alloc(p.dev, size, &p.host);
    if (st == OTE_OK) st = ote_cuda_host_alloc(p.dev, size, &p.host2);
    if (st == OTE_OK) st = ote_cuda_alloc_create(p.dev, size, 0, &p.da);
    if (st == OTE_OK) st = ote_cuda_alloc_create(p.dev, size, 0, &p.db);
    if (st != OTE_OK) goto out;
    st = check_round_trip(&p);
    if (st != OTE_OK) goto out;
    if (!json)
        printf("device %d (%s), %zu MiB per copy, %d iterations\n%-5s %14s %14s %8s\n", ordinal,
               ote_cuda_device_name(p.dev), size >> 20, iters, "copy", "owners GB/s", "direct GB/s",
               "ratio");
    ote_cuda_copy_kind_t kinds[] = {OTE_CUDA_COPY_HTOD, OTE_CUDA_COPY_DTOH, OTE_CUDA_COPY_DTOD};
    for (int k = 0; k < 3; k++) {
        double secs[2] = {0, 0};
        for (int way = 0; way < 2; way++) {
            /* one warm-up copy, then the timed ones */
            st = way == 0 ? owner_copy(&p, kinds[k]) : direct_copy(&p, kinds[k]);
            if (st == OTE_OK && way == 1 && kinds[k] == OTE_CUDA_COPY_DTOD) st = direct_fence(&p);
            if (st != OTE_OK) goto out;
            uint64_t t0 = ote_now_ns();
            for (int i = 0; i < iters && st == OTE_OK; i++)
                st = way == 0 ? owner_copy(&p, kinds[k]) : direct_copy(&p, kinds[k]);
            if (st == OTE_OK && way == 1 && kinds[k] == OTE_CUDA_COPY_DTOD) st = direct_fence(&p);
            if (st != OTE_OK) goto out;
            secs[way] = (double)(ote_now_ns() - t0) / 1e9;
        }
        double gb = (double)size * iters / 1e9;
        double owners = gb / secs[0], direct = gb / secs[1];
        if (json)
            printf(
                "{\"copy\":\"%s\",\"bytes\":%zu,\"iters\":%d,\"owners_gbps\":%.3f,\"direct_gbps\":%"
                ".3f,"
                "\"ratio\":%.3f}\n",
                kind_name(kinds[k]), size, iters, owners, direct, owners / direct);
        else
            printf("%-5s %14.2f %14.2f %7.2fx\n", kind_name(kinds[k]), owners, direct,
                   owners / direct);
    }
    rc = 0;

out:
    if (st != OTE_OK) {
        char buf[160];
        fprintf(stderr, "bw_probe: failed: %s\n", ote_status_describe(st, buf, sizeof(buf)));
    }
    ote_deadline_t d = ote_deadline_after(60ull * OTE_NSEC_PER_SEC);
    if (p.stream != NULL && ote_cuda_stream_destroy(p.stream, d) != OTE_OK) rc = 1;
    if (p.db != NULL && ote_cuda_alloc_destroy(p.db, d) != OTE_OK) rc = 1;
    if (p.da != NULL && ote_cuda_alloc_destroy(p.da, d) != OTE_OK) rc = 1;
    if (p.host2 != NULL && ote_cuda_host_mem_destroy(p.host2, d) != OTE_OK) rc = 1;
    if (p.host != NULL && ote_cuda_host_mem_destroy(p.host, d) != OTE_OK) rc = 1;
    if (p.dev != NULL && ote_cuda_device_close(p.dev) != OTE_OK) rc = 1;
    if (ote_cuda_driver_unload(p.drv) != OTE_OK) rc = 1;
    return rc;
}

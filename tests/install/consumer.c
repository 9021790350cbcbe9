/*
 * tests/install/consumer.c - a C program outside Bazel, built against an installed OrbitTE
 * (scripts/install.sh) through pkg-config or CMake: two engines on loopback over tcp, a
 * 4 MiB WRITE and a READ back, every byte compared. Prints the library's version and
 * "consumer: ok"; exits non-zero on any failure.
 */
#include <ote/ote.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (4u << 20)
#define CHECK(call) \
    do { \
        ote_status_t st_ = (call); \
        if (st_ != OTE_OK) { \
            fprintf(stderr, "consumer: %s failed: %s\n", #call, ote_status_str(st_)); \
            return 1; \
        } \
    } while (0)

static int make_engine(ote_engine_t **out) {
    ote_config_t *cfg = NULL;
    CHECK(ote_config_create(&cfg));
    CHECK(ote_config_set(cfg, "transports", "tcp"));
    ote_status_t st = ote_engine_create(cfg, out);
    ote_config_destroy(cfg);
    CHECK(st);
    return 0;
}

static int transfer(ote_segment_t *seg, ote_engine_t *e, ote_opcode_t op, uint8_t *local,
                    uint64_t remote) {
    ote_batch_t *b = NULL;
    CHECK(ote_batch_create(e, 1, &b));
    ote_request_t r = {op, local, seg, remote, LEN};
    CHECK(ote_batch_submit(b, &r, 1));
    CHECK(ote_batch_wait(b, 30ull * 1000 * 1000 * 1000));
    CHECK(ote_batch_destroy(b));
    return 0;
}

int main(void) {
    printf("consumer: liborbitte %s (header %d.%d.%d)\n", ote_version(), OTE_VERSION_MAJOR,
           OTE_VERSION_MINOR, OTE_VERSION_PATCH);
    ote_engine_t *target = NULL, *eng = NULL;
    if (make_engine(&target) != 0 || make_engine(&eng) != 0) return 1;
    uint8_t *kv = calloc(1, LEN), *src = malloc(LEN), *back = calloc(1, LEN);
    if (kv == NULL || src == NULL || back == NULL) return 1;
    for (size_t i = 0; i < LEN; i++) src[i] = (uint8_t)(i * 131 + 7);
    CHECK(ote_memory_register(target, kv, LEN, OTE_PERM_READ | OTE_PERM_WRITE));
    CHECK(ote_memory_register(eng, src, LEN, OTE_PERM_READ | OTE_PERM_WRITE));
    CHECK(ote_memory_register(eng, back, LEN, OTE_PERM_READ | OTE_PERM_WRITE));
    char addr[64];
    CHECK(ote_engine_address(target, addr, sizeof(addr)));
    ote_segment_t *seg = NULL;
    CHECK(ote_segment_open(eng, addr, &seg));
    if (transfer(seg, eng, OTE_WRITE, src, (uint64_t)(uintptr_t)kv) != 0) return 1;
    if (memcmp(kv, src, LEN) != 0) {
        fprintf(stderr, "consumer: the target's bytes differ after the WRITE\n");
        return 1;
    }
    if (transfer(seg, eng, OTE_READ, back, (uint64_t)(uintptr_t)kv) != 0) return 1;
    if (memcmp(back, src, LEN) != 0) {
        fprintf(stderr, "consumer: the bytes READ back differ\n");
        return 1;
    }
    CHECK(ote_segment_close(seg));
    CHECK(ote_memory_unregister(eng, src));
    CHECK(ote_memory_unregister(eng, back));
    CHECK(ote_memory_unregister(target, kv));
    CHECK(ote_engine_destroy(eng));
    CHECK(ote_engine_destroy(target));
    free(kv);
    free(src);
    free(back);
    printf("consumer: ok (%u bytes written and read back over tcp)\n", LEN);
    return 0;
}

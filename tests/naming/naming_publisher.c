/*
 * tests/naming/naming_publisher.c - a child process for the naming tests: an engine on
 * TCP at argv[5] with a 1 MiB buffer "kv" filled with byte argv[4], published under
 * argv[2] at store url argv[1] with ttl argv[3] ms; argv[6], when given, is its
 * transports list ("tcp" by default; with rdma, over verbs_provider sim). Prints
 * "ready <addr>" and waits for EOF on stdin (then withdraws its name and exits 0); the
 * tests SIGKILL it to play a dead publisher, SIGSTOP it to play a hung one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ote/naming.h"
#include "ote/ote.h"

#define KV_LEN (1u << 20)

static int fail(const char *what, ote_status_t st) {
    fprintf(stderr, "naming_publisher: %s: %s\n", what, ote_status_str(st));
    printf("failed %s\n", what);
    fflush(stdout);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) return 2;
    const char *transports = argc == 7 ? argv[6] : "tcp";
    ote_config_t *cfg = NULL;
    ote_engine_t *e = NULL;
    ote_status_t st = ote_config_create(&cfg);
    if (st == OTE_OK) st = ote_config_set(cfg, "transports", transports);
    if (st == OTE_OK && strstr(transports, "rdma") != NULL)
        st = ote_config_set(cfg, "verbs_provider", "sim");
    if (st == OTE_OK) st = ote_config_set(cfg, "listen_address", argv[5]);
    if (st == OTE_OK) st = ote_engine_create(cfg, &e);
    ote_config_destroy(cfg);
    if (st != OTE_OK) return fail("engine", st);
    static unsigned char kv[KV_LEN];
    memset(kv, atoi(argv[4]), sizeof(kv));
    st = ote_memory_register_named(e, kv, sizeof(kv), OTE_PERM_READ | OTE_PERM_WRITE, "kv");
    if (st != OTE_OK) return fail("register", st);
    ote_naming_opts_t o = {0};
    o.ttl_ms = (uint32_t)atoi(argv[3]);
    o.timeout_ms = 1000;
    ote_naming_t *n = NULL;
    st = ote_naming_open(argv[1], &o, &n);
    if (st == OTE_OK) st = ote_naming_publish(n, argv[2], e);
    if (st != OTE_OK) return fail("publish", st);
    char addr[300];
    if (ote_engine_address(e, addr, sizeof(addr)) != OTE_OK) return fail("address", st);
    printf("ready %s\n", addr);
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof(buf)) > 0) {}
    ote_naming_close(n);
    (void)ote_memory_unregister(e, kv);
    ote_engine_destroy(e);
    return 0;
}

/* Uses OrbitTE through <ote/ote.h> alone: creates an engine on loopback, registers a
 * buffer, opens a segment to the engine itself, WRITEs a pattern into the registered
 * buffer and READs it back into a third one, checks every byte, and tears everything
 * down. Exits 0 only if every step worked. */
#include <ote/ote.h>
#include <stdio.h>
#include <string.h>

#define LEN (256u * 1024u)
#define TIMEOUT_NS (30ull * 1000 * 1000 * 1000)

static unsigned char src[LEN], dst[LEN], back[LEN];

static int check(const char *what, ote_status_t st) {
    if (st == OTE_OK) return 0;
    fprintf(stderr, "%s: %s\n", what, ote_status_str(st));
    return 1;
}

/* One request of `op` between `local` and the peer's `remote`, waited for. */
static int transfer(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, void *local,
                    void *remote) {
    ote_batch_t *b = NULL;
    if (check("batch_create", ote_batch_create(e, 1, &b))) return 1;
    ote_request_t r = {op, local, seg, (uint64_t)(uintptr_t)remote, LEN};
    int bad = check("batch_submit", ote_batch_submit(b, &r, 1));
    if (!bad) bad = check("batch_wait", ote_batch_wait(b, TIMEOUT_NS));
    bad |= check("batch_destroy", ote_batch_destroy(b));
    return bad;
}

static int run(ote_engine_t *e) {
    char addr[300];
    if (check("engine_address", ote_engine_address(e, addr, sizeof(addr)))) return 1;
    if (check("memory_register", ote_memory_register(e, dst, LEN, OTE_PERM_READ | OTE_PERM_WRITE)))
        return 1;
    ote_segment_t *seg = NULL;
    int bad = check("segment_open", ote_segment_open(e, addr, &seg));
    if (!bad) {
        bad = transfer(e, seg, OTE_WRITE, src, dst) || transfer(e, seg, OTE_READ, back, dst);
        bad |= check("segment_close", ote_segment_close(seg));
    }
    bad |= check("memory_unregister", ote_memory_unregister(e, dst));
    if (!bad && (memcmp(src, dst, LEN) != 0 || memcmp(src, back, LEN) != 0)) {
        fprintf(stderr, "data mismatch after WRITE and READ\n");
        bad = 1;
    }
    if (!bad) printf("engine_user: %u bytes written and read back over %s\n", LEN, addr);
    return bad;
}

int main(void) {
    for (unsigned i = 0; i < LEN; i++) src[i] = (unsigned char)(i * 7 + 3);
    ote_config_t *cfg = NULL;
    if (check("config_create", ote_config_create(&cfg))) return 1;
    int bad = check("config_set", ote_config_set(cfg, "listen_address", "127.0.0.1:0"));
    ote_engine_t *e = NULL;
    if (!bad) bad = check("engine_create", ote_engine_create(cfg, &e));
    ote_config_destroy(cfg);
    if (bad) return 1;
    bad = run(e);
    bad |= check("engine_destroy", ote_engine_destroy(e));
    return bad ? 1 : 0;
}

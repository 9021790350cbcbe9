/*
 * engine/gpu/gpu_services.c - the engine's GPU services as the transports see them
 * (ote__gpu_ops_t, engine/transport.h): staging bounce buffers and CUDA IPC at the
 * source and the requester, over this engine's ote__gpu_t. A pin is the engine's
 * registration as host->pin gave it (its ote__pin_t head): the services apply the
 * registration's own path rules (staging needs gpu_paths' staging; IPC exposes a whole
 * allocation, so only a registration with OTE_PERM_IPC).
 */
#include "engine/gpu/gpu.h"
#include "ote/ote.h"

static ote_status_t path_check(ote__gpu_t *g, const ote__pin_t *pin) {
    return ote__gpu_path_check(g, pin->kind, (pin->perms & OTE_PERM_IPC) != 0,
                               "a registered range");
}

static ote_status_t stage_get(void *arg, const ote__pin_t *pin, uint32_t len, ote_deadline_t dl,
                              uint8_t **buf_out, void **tok_out) {
    ote__gpu_t *g = arg;
    ote__gpu_bounce_t *t = NULL;
    ote_status_t st = path_check(g, pin);
    if (st == OTE_OK) st = ote__gpu_src_get(g, pin->kind, len, dl, buf_out, &t);
    if (st == OTE_OK) *tok_out = t;
    return st;
}

static ote_status_t stage_pooled(void *arg, const ote__pin_t *pin, uint32_t len, uint8_t **buf_out,
                                 void **tok_out) {
    ote__gpu_t *g = arg;
    ote__gpu_bounce_t *t = NULL;
    ote_status_t st = path_check(g, pin);
    if (st == OTE_OK) st = ote__gpu_src_get_pooled(g, pin->kind, len, buf_out, &t);
    if (st == OTE_OK) *tok_out = t;
    return st;
}

static ote_status_t stage_copy(void *arg, void *tok, int to_device, uint64_t dev_addr, uint32_t len,
                               ote_deadline_t dl) {
    return ote__gpu_src_copy(arg, tok, to_device, dev_addr, len, dl);
}

static ote_status_t stage_copy_start(void *arg, void *tok, int to_device, uint64_t dev_addr,
                                     uint32_t len, ote_deadline_t dl,
                                     void (*done)(void *, ote_status_t), void *done_arg) {
    return ote__gpu_src_copy_start(arg, tok, to_device, dev_addr, len, dl, done, done_arg);
}

static void stage_put(void *arg, void *tok) { ote__gpu_src_put(arg, tok); }

static int stage_chunk(void *arg, void *tok, uint8_t **base_out, uint64_t *size_out) {
    (void)arg;
    return ote__gpu_src_chunk(tok, base_out, size_out);
}

static ote_status_t ipc_export(void *arg, const ote__pin_t *pin, uint64_t addr, uint32_t len,
                               ote__ipc_desc_t *out, int *fd_out) {
    /* IPC exposes the whole allocation: only a registration that opted in. */
    if (!(pin->perms & OTE_PERM_IPC) || !OTE_MEM_IS_CUDA(pin->kind)) return OTE_ERR_UNSUPPORTED;
    return ote__gpu_ipc_export(arg, pin->kind, addr, len, out, fd_out);
}

static int ipc_usable(void *arg) {
    return ote__gpu_ipc_allowed(arg) && ote__gpu_driver_present(arg);
}

static ote_status_t ipc_copy_start(void *arg, uint64_t exporter, const ote__ipc_desc_t *desc,
                                   int fd, uint8_t *local, uint32_t local_kind, uint32_t len,
                                   int write, void **op_out) {
    ote__gpu_ipc_op_t *op = NULL;
    ote_status_t st =
        ote__gpu_ipc_copy_start(arg, exporter, desc, fd, local, local_kind, len, write, &op);
    *op_out = op; /* set on a failure too when the copy's outcome is unknown */
    return st;
}

static ote_status_t ipc_copy_poll(void *arg, void *op, int give_up) {
    return ote__gpu_ipc_copy_poll(arg, op, give_up);
}

static ote_status_t ipc_copy_settle(void *arg, void *op, int abandon) {
    return ote__gpu_ipc_copy_settle(arg, op, abandon);
}

static void ipc_revoked(void *arg, uint64_t exporter, uint64_t buffer_id) {
    ote__gpu_ipc_revoked(arg, exporter, buffer_id);
}

static void ipc_exporter_dead(void *arg, uint64_t exporter) {
    ote__gpu_ipc_exporter_dead(arg, exporter);
}

static ote_status_t device_place(void *arg, int dev, char *bus, size_t cap, int *node_out) {
    ote_status_t st = ote__gpu_pci_bus_id(arg, dev, bus, cap);
    if (st == OTE_OK) *node_out = ote__gpu_device_node(arg, dev);
    return st;
}

ote__gpu_ops_t ote__gpu_services(ote__gpu_t *g) {
    ote__gpu_ops_t ops = {.arg = g,
                          .stage_get = stage_get,
                          .stage_copy = stage_copy,
                          .stage_put = stage_put,
                          .stage_pooled = stage_pooled,
                          .stage_chunk = stage_chunk,
                          .stage_copy_start = stage_copy_start,
                          .ipc_export = ipc_export,
                          .ipc_usable = ipc_usable,
                          .ipc_copy_start = ipc_copy_start,
                          .ipc_copy_poll = ipc_copy_poll,
                          .ipc_copy_settle = ipc_copy_settle,
                          .ipc_revoked = ipc_revoked,
                          .ipc_exporter_dead = ipc_exporter_dead,
                          .device_place = device_place};
    return ops;
}

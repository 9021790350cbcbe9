/*
 * engine/router.c - the engine's transports and the choice of one per segment.
 *
 * An engine creates every transport of its `transports` list (config; default "shm,tcp",
 * any order of distinct tcp, rdma, shm). One listening socket (listen.c) gives the
 * engine its "host:port" and hands each connection to the transport its HELLO names
 * (tcp data, rdma control), after the back-off and the authentication; a HELLO naming a
 * transport outside the list is refused. The router's INFO handshakes go to the first
 * transport created (tcp, else rdma); an engine whose list has neither (transports=shm)
 * still creates the TCP transport for that, and names only "shm" in its list.
 *
 * The advertisement (host->info, sent in every HELLO_ACK) is "key=value;..." text:
 *
 *   transports=shm,tcp   the engine's list, in its order
 *   boot=<boot id>       /proc/sys/kernel/random/boot_id (plus the test suffix below)
 *   netns=, userns=, pidns=, mntns=   inode numbers of the namespaces that decide whether
 *                        memory and UNIX sockets of the peer are reachable
 *   uid=, pid=           the process's credentials
 *   buffers=1            the listener answers BUFS_REQ (buffer discovery, discover.c)
 *   epoch=<16 hex>       this engine instance's epoch (host->epoch): a TCP or shm peer
 *                        that reconnects and finds another one fails its segment
 *                        (ote_ctl_info_incarnation)
 *   <transport keys>     each transport's own part (ops->advert), e.g. shm=<socket>
 *
 * An engine with transports=tcp opens it directly, as before routing existed, and asks
 * the peer for its list only when that open fails, to report a mismatch of lists as one. Otherwise ote_segment_open first asks the peer for
 * its advertisement (a HELLO with role
 * OTE_CTL_ROLE_INFO on a short TCP connection), then takes the first transport of this
 * engine's list that the peer offers and that can reach it (peer_open_info answers
 * OTE_ERR_UNSUPPORTED when it cannot). A peer without an advertisement (an older engine)
 * is tried with this engine's transports in order, shm excepted. A transport outside the
 * list is never used: no common transport fails with OTE_ERR_UNSUPPORTED and an ERROR line
 * that names both lists. The choice is logged at INFO and read with ote_segment_info.
 *
 * Test hook (engine/hooks.h, installed only by the test-only //engine:testing): a suffix
 * appended to the advertised boot id, so a test can make two engines of one host look
 * like two hosts.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/le.h"
#include "base/list.h"
#include "base/log.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/control/hello.h"
#include "engine/control/sock.h"
#include "engine/core_internal.h"
#include "engine/file/file.h"
#include "engine/listen_internal.h"
#include "engine/router_internal.h"

static ote_status_t create_one(ote_engine_t *e, const char *name, const ote__host_t *host) {
    ote__transport_t *tp = NULL;
    ote_status_t st;
    if (strcmp(name, "tcp") == 0) st = ote__tcp_create(&e->cfg, host, &tp);
    else if (strcmp(name, "rdma") == 0) st = ote__rdma_create(&e->cfg, host, &tp);
    else st = ote__shm_create(&e->cfg, host, &tp);
    if (st != OTE_OK) return st;
    e->tps[e->ntps] = tp;
    snprintf(e->tpnames[e->ntps], sizeof(e->tpnames[0]), "%s", name);
    e->ntps++;
    return OTE_OK;
}

static void ns_ino(const char *which, char *buf, size_t len) {
    char path[64];
    struct stat sb;
    snprintf(path, sizeof(path), "/proc/self/ns/%s", which);
    if (stat(path, &sb) == 0) snprintf(buf, len, "%llu", (unsigned long long)sb.st_ino);
    else snprintf(buf, len, "none");
}

static void build_info(ote_engine_t *e) {
    char boot[64] = "unknown";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL) snprintf(boot, sizeof(boot), "unknown");
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    const char *suffix = ote__engine_hooks.host_suffix ? ote__engine_hooks.host_suffix() : NULL;
    char net[24], user[24], pidn[24], mnt[24];
    ns_ino("net", net, sizeof(net));
    ns_ino("user", user, sizeof(user));
    ns_ino("pid", pidn, sizeof(pidn));
    ns_ino("mnt", mnt, sizeof(mnt));
    size_t o = (size_t)snprintf(e->info, sizeof(e->info),
                                "transports=%s;boot=%s%.32s;netns=%s;userns=%s;pidns=%s;mntns=%s;"
                                "uid=%u;pid=%d;buffers=1;epoch=%016llx",
                                e->cfg.transports, boot, suffix ? suffix : "", net, user, pidn, mnt,
                                (unsigned)getuid(), (int)getpid(), (unsigned long long)e->epoch);
    for (size_t i = 0; i < e->ntps && o + 2 < sizeof(e->info); i++) {
        char adv[256] = "";
        if (e->tps[i]->ops->advert == NULL ||
            e->tps[i]->ops->advert(e->tps[i], adv, sizeof(adv)) != OTE_OK || adv[0] == '\0')
            continue;
        o += (size_t)snprintf(e->info + o, sizeof(e->info) - o, ";%s", adv);
    }
    if (o >= sizeof(e->info)) e->info[0] = '\0'; /* never a truncated advertisement */
}

static void conn_closed(void *arg) { ote__listen_release(((ote_engine_t *)arg)->lst); }

ote_status_t ote__router_create(ote_engine_t *e, const ote__router_upcalls_t *up) {
    /* The listener first: its address names the engine to every transport. */
    ote_status_t st = ote__listen_create(e, &e->lst);
    if (st != OTE_OK) return st;
    /* The lines of every thread tagged with e->log_tag name the engine from here on. */
    const char *name = e->cfg.engine_name;
    snprintf(e->log_tag, sizeof(e->log_tag), "%s%s%s", name, name[0] != '\0' ? "@" : "",
             e->self_addr);
    ote__host_t host = {.arg = e,
                        .pin = up->pin,
                        .unpin = up->unpin,
                        .deliver_notify = up->deliver_notify,
                        .info = e->info,
                        .self_addr = e->self_addr,
                        .self_name = e->cfg.engine_name,
                        .log_tag = e->log_tag,
                        .query_info = ote__router_query_info,
                        .buffers = up->buffers,
                        .auth_key = e->auth_key,
                        .conn_closed = conn_closed,
                        .gpu = ote__gpu_services(e->gpu),
                        .file = ote__files_services(e->files),
                        .shared_find = up->shared_find,
                        .shared_count = &e->nshared_hint,
                        .epoch = e->epoch};
    /* The transport that answers INFO handshakes on the listener first (tcp, else rdma;
     * an shm-only engine creates tcp for it, outside its list), then the others in
     * order. */
    const char *lname = ote_list_has(e->cfg.transports, "tcp")    ? "tcp"
                        : ote_list_has(e->cfg.transports, "rdma") ? "rdma"
                                                                  : "tcp";
    st = create_one(e, lname, &host);
    ote_list_iter_t it = ote_list_iter(e->cfg.transports, ',');
    const char *item;
    size_t l;
    while (st == OTE_OK && ote_list_next(&it, &item, &l)) {
        char name[8];
        snprintf(name, sizeof(name), "%.*s", (int)l, item);
        if (strcmp(name, lname) == 0) continue;
        st = create_one(e, name, &host);
    }
    if (st != OTE_OK) {
        if (ote__router_destroy(e) != OTE_OK) e->retained = 1;
        return st;
    }
    e->tp = e->tps[0];
    build_info(e);
    st = ote__listen_start(e->lst);
    if (st != OTE_OK) {
        if (ote__router_destroy(e) != OTE_OK) e->retained = 1;
        return st;
    }
    OTE_INFO("engine", "engine %s serves transports %s", e->self_addr, e->cfg.transports);
    return OTE_OK;
}

ote_status_t ote__router_destroy(ote_engine_t *e) {
    /* Nothing new reaches the transports, then they go (the others first: the listener
     * transport answers INFO), then the listener, which their closing connections
     * still report to. A transport that is retained (a native owner that would not be
     * destroyed, or a thread that did not end) stays in the list, with the listener
     * object, for the next call; the others are gone. */
    ote__listen_stop(e->lst);
    e->tp = NULL;
    ote_status_t res = OTE_OK;
    int keep[OTE__MAX_TRANSPORTS] = {0};
    for (size_t i = e->ntps; i-- > 0;) {
        ote__transport_t *tp = e->tps[i];
        ote_status_t st = tp->ops->destroy(tp);
        if (st == OTE_OK) continue;
        OTE_ERROR("engine", "transport %s retained at engine destroy: %s", e->tpnames[i],
                  ote_status_str(st));
        if (res == OTE_OK) res = st;
        keep[i] = 1;
    }
    size_t kept = 0;
    for (size_t i = 0; i < e->ntps; i++) {
        if (!keep[i]) continue;
        if (kept != i) {
            e->tps[kept] = e->tps[i];
            memcpy(e->tpnames[kept], e->tpnames[i], sizeof(e->tpnames[kept]));
        }
        kept++;
    }
    e->ntps = kept;
    if (res != OTE_OK) return res;
    ote__listen_free(e->lst);
    e->lst = NULL;
    return OTE_OK;
}

ote_status_t ote__router_mem_register(ote_engine_t *e, void *addr, size_t len, unsigned perms) {
    for (size_t i = 0; i < e->ntps; i++) {
        if (e->tps[i]->ops->mem_register == NULL) continue;
        ote_status_t st = e->tps[i]->ops->mem_register(e->tps[i], addr, len, perms);
        if (st == OTE_OK) continue;
        while (i-- > 0)
            if (e->tps[i]->ops->mem_unregister != NULL)
                (void)e->tps[i]->ops->mem_unregister(e->tps[i], addr);
        return st;
    }
    return OTE_OK;
}

ote_status_t ote__router_mem_unregister(ote_engine_t *e, void *addr) {
    for (size_t i = 0; i < e->ntps; i++) {
        if (e->tps[i]->ops->mem_unregister == NULL) continue;
        ote_status_t st = e->tps[i]->ops->mem_unregister(e->tps[i], addr);
        if (st != OTE_OK) return st;
    }
    return OTE_OK;
}

ote_status_t ote__router_mem_register_dmabuf(ote_engine_t *e, void *addr, size_t len, int fd,
                                             uint64_t offset) {
    size_t done = 0;
    for (size_t i = 0; i < e->ntps; i++) {
        if (e->tps[i]->ops->mem_register_dmabuf == NULL) continue;
        ote_status_t st = e->tps[i]->ops->mem_register_dmabuf(e->tps[i], addr, len, fd, offset);
        if (st == OTE_OK) {
            done++;
            continue;
        }
        while (i-- > 0)
            if (e->tps[i]->ops->mem_register_dmabuf != NULL)
                (void)e->tps[i]->ops->mem_unregister(e->tps[i], addr);
        return st;
    }
    return done > 0 ? OTE_OK : OTE_ERR_UNSUPPORTED;
}

void ote__router_shared_free(ote_engine_t *e, uint64_t id) {
    for (size_t i = 0; i < e->ntps; i++)
        if (e->tps[i]->ops->shared_free != NULL) e->tps[i]->ops->shared_free(e->tps[i], id);
}

void ote__router_ipc_revoke(ote_engine_t *e, uint64_t start, uint64_t len) {
    for (size_t i = 0; i < e->ntps; i++)
        if (e->tps[i]->ops->ipc_revoke != NULL) e->tps[i]->ops->ipc_revoke(e->tps[i], start, len);
}

/* A connection to peer's listener, handshaken with the role INFO by dl: its fd, the
 * version the peer chose and its advertisement ("" from an engine that sends none). */
ote_status_t ote__router_hello(ote_engine_t *e, const char *peer, ote_deadline_t dl, int *fd_out,
                               uint16_t *version_out, char *info, size_t cap) {
    if (cap == 0) return OTE_ERR_INVALID;
    int fd = -1;
    ote_status_t st = ote__addr_dial(peer, dl, "engine", &fd);
    if (st != OTE_OK) return st;
    uint8_t buf[OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY];
    ote_ctl_hello_t h = {.role = OTE_CTL_ROLE_INFO, .addr = e->self_addr};
    ote_auth_sock_t as = {fd, buf, sizeof(buf), dl};
    ote_auth_io_t io = ote_auth_sock_io(&as);
    ote_ctl_msg_t m;
    uint16_t ver = 0;
    st = ote_ctl_hello_exchange(e->auth_key, &h, &io, peer, &m, &ver);
    if (st != OTE_OK) {
        close(fd);
        return st;
    }
    size_t il = m.u.hello_ack.info_len < cap ? m.u.hello_ack.info_len : 0;
    memcpy(info, m.u.hello_ack.info, il);
    info[il] = '\0';
    *fd_out = fd;
    *version_out = ver;
    return OTE_OK;
}

/* The peer's advertisement ("" from an engine that sends none). */
static ote_status_t query_info(ote_engine_t *e, const char *peer, char *info, size_t cap) {
    ote_deadline_t dl = ote_deadline_after(e->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    int fd = -1;
    uint16_t ver = 0;
    ote_status_t st = ote__router_hello(e, peer, dl, &fd, &ver, info, cap);
    if (st != OTE_OK) {
        OTE_WARN("engine", "asking %s for its transports failed: %s", peer, ote_status_str(st));
        return st;
    }
    close(fd);
    return OTE_OK;
}

ote_status_t ote__router_query_info(void *arg, const char *peer, char *buf, size_t cap) {
    return query_info(arg, peer, buf, cap);
}

/* transports=tcp: open it directly, exactly as before routing existed (no extra
 * connection); only when that fails is the peer asked for its list, so that a mismatch
 * is reported as one. 1 when handled (*st_out set). */
static int open_single(ote_engine_t *e, const char *peer, char *info, ote__transport_t **tp_out,
                       const char **name_out, ote__tpeer_t **peer_out, ote_status_t *st_out) {
    ote__transport_t *tp = NULL;
    const char *tname = NULL;
    for (size_t j = 0; j < e->ntps; j++)
        if (strcmp(e->tpnames[j], e->cfg.transports) == 0) {
            tp = e->tps[j];
            tname = e->tpnames[j];
        }
    if (tp == NULL || strcmp(tname, "tcp") != 0) return 0;
    ote__tpeer_t *tpeer = NULL;
    ote_status_t st = tp->ops->peer_open(tp, peer, &tpeer);
    int code = ote_status_code(st);
    if (st == OTE_OK) {
        OTE_INFO("engine", "segment %s: transport %s (this engine offers only %s)", peer, tname,
                 tname);
        *tp_out = tp;
        *name_out = tname;
        *peer_out = tpeer;
    } else if (code != OTE_ERR_TIMEOUT && code != OTE_ERR_CONNECT && code != OTE_ERR_AUTH &&
               code != OTE_ERR_PROTOCOL) {
        /* It answered, as an engine, and refused tcp: ask for its list, so that a mismatch
         * is reported as one. (A peer that did not answer in time, or not as an engine,
         * is not asked again: its deadline is spent.) */
        char plist[64];
        if (query_info(e, peer, info, OTE_CTL_MAX_INFO + 1) == OTE_OK &&
            ote_ctl_info_get(info, "transports", plist, sizeof(plist)) == OTE_OK &&
            !ote_list_has(plist, tname)) {
            OTE_ERROR("engine",
                      "segment_open %s: no common transport: this engine offers transports=%s, "
                      "the peer transports=%s",
                      peer, e->cfg.transports, plist);
            st = OTE_ERR_UNSUPPORTED;
        }
    }
    *st_out = st;
    return 1;
}

ote_status_t ote__router_open(ote_engine_t *e, const char *peer, ote__transport_t **tp_out,
                              const char **name_out, ote__tpeer_t **peer_out) {
    char *info = ote_malloc(OTE_CTL_MAX_INFO + 1);
    if (info == NULL) return OTE_ERR_NOMEM;
    ote_status_t st;
    if (open_single(e, peer, info, tp_out, name_out, peer_out, &st)) {
        ote_free(info);
        return st;
    }
    st = query_info(e, peer, info, OTE_CTL_MAX_INFO + 1);
    /* A peer that answered but whose answer the router cannot use (another version, a
     * limit out of range, garbage) is left to the transports, whose own handshakes say
     * precisely what is wrong; one that cannot be reached, or that refused this engine's
     * authentication (or lack of it), fails here. */
    int code = ote_status_code(st);
    ote_status_t qst = st; /* what the peer's answer was, should no transport try it */
    if (st != OTE_OK && code != OTE_ERR_CONNECT && code != OTE_ERR_TIMEOUT &&
        code != OTE_ERR_NOMEM && code != OTE_ERR_INVALID && code != OTE_ERR_AUTH) {
        info[0] = '\0';
        st = OTE_OK;
    }
    char plist[64] = "";
    if (st == OTE_OK && ote_ctl_info_get(info, "transports", plist, sizeof(plist)) != OTE_OK)
        plist[0] = '\0'; /* an engine without routing: its list is unknown */
    ote_list_iter_t it = ote_list_iter(e->cfg.transports, ',');
    const char *want;
    size_t wl;
    while (st == OTE_OK && ote_list_next(&it, &want, &wl)) {
        ote__transport_t *tp = NULL;
        const char *tname = NULL;
        for (size_t j = 0; j < e->ntps; j++)
            if (ote_list_item_is(want, wl, e->tpnames[j])) {
                tp = e->tps[j];
                tname = e->tpnames[j];
            }
        if (tp == NULL) continue; /* the listener of an shm-only engine is not in its list */
        if (plist[0] ? !ote_list_has(plist, tname) : strcmp(tname, "shm") == 0) continue;
        ote__tpeer_t *tpeer = NULL;
        ote_status_t ost = tp->ops->peer_open_info ? tp->ops->peer_open_info(tp, peer, info, &tpeer)
                                                   : tp->ops->peer_open(tp, peer, &tpeer);
        if (ost == OTE_ERR_UNSUPPORTED) continue;
        if (ost == OTE_OK) {
            OTE_INFO("engine", "segment %s: transport %s (this engine offers %s, the peer %s)",
                     peer, tname, e->cfg.transports, plist[0] ? plist : "an unknown list");
            *tp_out = tp;
            *name_out = tname;
            *peer_out = tpeer;
        }
        ote_free(info);
        return ost;
    }
    if (st == OTE_OK && qst != OTE_OK) {
        /* No transport could try the peer, and its answer was not an engine's (garbage, or
         * a version we do not speak): that is what is wrong, not the lists. */
        st = ote_status_code(qst) == OTE_ERR_VERSION ? qst : OTE_ERR_PROTOCOL;
    } else if (st == OTE_OK) {
        OTE_ERROR("engine",
                  "segment_open %s: no common transport: this engine offers transports=%s, the "
                  "peer transports=%s",
                  peer, e->cfg.transports, plist[0] ? plist : "(not advertised)");
        st = OTE_ERR_UNSUPPORTED;
    }
    ote_free(info);
    return st;
}

ote_status_t ote_segment_info(ote_segment_t *seg, ote_segment_info_t *info_out) {
    if (seg == NULL || info_out == NULL) return OTE_ERR_INVALID;
    ote_segment_info_t r;
    memset(&r, 0, sizeof(r));
    snprintf(r.transport, sizeof(r.transport), "%s", seg->tpname);
    snprintf(r.peer, sizeof(r.peer), "%s", seg->name);
    *info_out = r;
    return OTE_OK;
}

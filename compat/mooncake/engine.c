/*
 * compat/mooncake/engine.c - the engine handle: create (P2PHANDSHAKE only), the OrbitTE
 * engine behind it (created with its transports at once or at the first installTransport),
 * its address, destroy, and the mapping of OrbitTE statuses to Mooncake's codes.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "compat/mooncake/compat_internal.h"

#define P2PHANDSHAKE "P2PHANDSHAKE"

/* ---- statuses ------------------------------------------------------------------------ */

int ote__mc_err(ote_status_t st) {
    switch (ote_status_code(st)) {
        case OTE_OK: return 0;
        case OTE_ERR_BUSY: return OTE_MC_ERR_BATCH_BUSY;
        case OTE_ERR_EXISTS: return OTE_MC_ERR_ADDRESS_OVERLAPPED;
        case OTE_ERR_NO_DEVICE:
        case OTE_ERR_PORT_DOWN: return OTE_MC_ERR_DEVICE_NOT_FOUND;
        case OTE_ERR_NOMEM: return OTE_MC_ERR_MEMORY;
        case OTE_ERR_UNSUPPORTED: return OTE_MC_ERR_NOT_IMPLEMENTED;
        case OTE_ERR_VERSION:
        case OTE_ERR_AUTH:
        case OTE_ERR_PROTOCOL: return OTE_MC_ERR_REJECT_HANDSHAKE;
        case OTE_ERR_CONNECT:
        case OTE_ERR_PEER_LOST:
        case OTE_ERR_TIMEOUT:
        case OTE_ERR_AGAIN: return OTE_MC_ERR_SOCKET;
        case OTE_ERR_NATIVE:
        case OTE_ERR_DEVICE_FATAL:
        case OTE_ERR_RETAINED:
        case OTE_ERR_FENCED:
        case OTE_ERR_IO: return OTE_MC_ERR_CONTEXT;
        default: return OTE_MC_ERR_INVALID_ARGUMENT;
    }
}

int ote__mc_code(ote_status_t st) {
    switch (ote_status_code(st)) {
        case OTE_OK: return OTE_MC_CODE_OK;
        case OTE_ERR_BUSY: return OTE_MC_CODE_BATCH_BUSY;
        case OTE_ERR_EXISTS: return OTE_MC_CODE_ADDRESS_OVERLAPPED;
        case OTE_ERR_NO_DEVICE:
        case OTE_ERR_PORT_DOWN: return OTE_MC_CODE_DEVICE_NOT_FOUND;
        case OTE_ERR_NOMEM: return OTE_MC_CODE_MEMORY;
        case OTE_ERR_UNSUPPORTED: return OTE_MC_CODE_NOT_IMPLEMENTED;
        case OTE_ERR_VERSION:
        case OTE_ERR_AUTH:
        case OTE_ERR_PROTOCOL: return OTE_MC_CODE_REJECT_HANDSHAKE;
        case OTE_ERR_CONNECT:
        case OTE_ERR_PEER_LOST:
        case OTE_ERR_TIMEOUT:
        case OTE_ERR_AGAIN: return OTE_MC_CODE_SOCKET;
        case OTE_ERR_NATIVE:
        case OTE_ERR_DEVICE_FATAL:
        case OTE_ERR_RETAINED:
        case OTE_ERR_FENCED:
        case OTE_ERR_IO: return OTE_MC_CODE_CONTEXT;
        default: return OTE_MC_CODE_INVALID_ARGUMENT;
    }
}

/* ---- handles ------------------------------------------------------------------------- */

mc_engine_t *ote__mc_engine(transfer_engine_t handle, const char *fn) {
    mc_engine_t *e = handle;
    if (e == NULL || e->magic != MC_ENGINE_MAGIC) {
        OTE_ERROR(MC_LOG, "%s: %p is not a transfer engine of createTransferEngine", fn, handle);
        return NULL;
    }
    return e;
}

ote_engine_t *ote__mc_ote(mc_engine_t *e, const char *fn) {
    ote_mutex_lock(&e->mu);
    ote_engine_t *ote = e->ote;
    ote_mutex_unlock(&e->mu);
    if (ote == NULL)
        OTE_ERROR(MC_LOG,
                  "%s: no transport installed yet (call installTransport(\"tcp\"|\"rdma\"), or "
                  "create the engine with auto_discover)",
                  fn);
    return ote;
}

/* ---- the OrbitTE engine -------------------------------------------------------------- */

/* Create the OrbitTE engine serving proto ("tcp" or "rdma"; same-host peers over shm).
 * Called with e->mu held (or before the handle is returned): creation binds the listener
 * and opens devices, and talks to no peer. */
static ote_status_t engine_start(mc_engine_t *e, const char *proto) {
    char transports[sizeof e->transports];
    snprintf(transports, sizeof transports, "shm,%s", proto);
    ote_config_t *cfg = NULL;
    ote_status_t st = ote_config_create(&cfg);
    if (st != OTE_OK) return st;
    st = ote_config_set(cfg, "transports", transports);
    if (st == OTE_OK) st = ote_config_set(cfg, "listen_address", e->listen);
    ote_engine_t *ote = NULL;
    if (st == OTE_OK) st = ote_engine_create(cfg, &ote);
    ote_config_destroy(cfg);
    if (st != OTE_OK) return st;
    st = ote_engine_address(ote, e->address, sizeof e->address);
    if (st != OTE_OK) {
        (void)ote_engine_destroy(ote);
        return st;
    }
    memcpy(e->transports, transports, sizeof transports);
    e->ote = ote; /* owned by e from here until destroyTransferEngine */
    OTE_INFO(MC_LOG, "engine at %s serves %s", e->address, transports);
    return OTE_OK;
}

/* Whether auto-discovery would find an RDMA device: the verbs sim chosen by the
 * environment (OTE_VERBS_PROVIDER=sim), or a device under /sys/class/infiniband. */
static int rdma_present(void) {
    const char *force = getenv("MC_FORCE_TCP");
    if (force != NULL && (strcmp(force, "1") == 0 || strcasecmp(force, "true") == 0)) return 0;
    const char *prov = getenv("OTE_VERBS_PROVIDER");
    if (prov != NULL && strcmp(prov, "sim") == 0) return 1;
    DIR *d = opendir("/sys/class/infiniband");
    if (d == NULL) return 0;
    int found = 0;
    for (struct dirent *de = readdir(d); de != NULL && !found; de = readdir(d))
        found = de->d_name[0] != '.';
    closedir(d);
    return found;
}

/* auto_discover: rdma when a device is present, falling back to tcp (as Mooncake's
 * discovery does), else tcp. */
static ote_status_t engine_discover(mc_engine_t *e) {
    if (rdma_present()) {
        ote_status_t st = engine_start(e, "rdma");
        if (st == OTE_OK) return OTE_OK;
        OTE_WARN(MC_LOG, "auto_discover: the rdma transport failed (%s): falling back to tcp",
                 ote_status_str(st));
    }
    return engine_start(e, "tcp");
}

/* "host:port" to listen on: ip_or_host_name (else local_server_name's host, else
 * 127.0.0.1) and rpc_port; IPv6 bracketed. */
static int listen_address(mc_engine_t *e, const char *local_server_name, const char *ip,
                          uint64_t rpc_port) {
    char host[256] = "";
    if (ip != NULL && ip[0] != '\0') {
        snprintf(host, sizeof host, "%s", ip);
    } else if (local_server_name != NULL && local_server_name[0] != '\0') {
        snprintf(host, sizeof host, "%s", local_server_name);
        char *colon = strrchr(host, ':');
        if (host[0] == '[') {
            char *end = strchr(host, ']');
            if (end != NULL) *end = '\0';
            memmove(host, host + 1, strlen(host));
        } else if (colon != NULL && strchr(host, ':') == colon) {
            *colon = '\0'; /* "host:port": Mooncake ignores the port in P2P mode */
        }
    } else {
        snprintf(host, sizeof host, "127.0.0.1");
    }
    if (rpc_port > 65535 || strlen(host) + 10 > sizeof e->listen) return -1;
    if (strchr(host, ':') != NULL && host[0] != '[')
        snprintf(e->listen, sizeof e->listen, "[%s]:%u", host, (unsigned)rpc_port);
    else snprintf(e->listen, sizeof e->listen, "%s:%u", host, (unsigned)rpc_port);
    return 0;
}

transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name, const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover) {
    if (metadata_conn_string == NULL || strcmp(metadata_conn_string, P2PHANDSHAKE) != 0) {
        OTE_ERROR(MC_LOG,
                  "createTransferEngine: metadata server \"%s\" is not supported: OrbitTE has no "
                  "name service; peers find each other by \"host:port\" (use \"%s\")",
                  metadata_conn_string ? metadata_conn_string : "(null)", P2PHANDSHAKE);
        return NULL;
    }
    mc_engine_t *e = ote_calloc(1, sizeof *e);
    if (e == NULL) {
        OTE_ERROR(MC_LOG, "createTransferEngine: out of memory");
        return NULL;
    }
    if (listen_address(e, local_server_name, ip_or_host_name, rpc_port) != 0) {
        OTE_ERROR(MC_LOG, "createTransferEngine: bad host \"%s\" or rpc_port %llu",
                  ip_or_host_name ? ip_or_host_name : "", (unsigned long long)rpc_port);
        goto err_free;
    }
    if (ote_mutex_init(&e->mu) != OTE_OK) {
        OTE_ERROR(MC_LOG, "createTransferEngine: cannot create a mutex");
        goto err_free;
    }
    e->next_batch = 1;
    e->magic = MC_ENGINE_MAGIC;
    if (auto_discover) {
        ote_status_t st = engine_discover(e);
        if (st != OTE_OK) {
            OTE_ERROR(MC_LOG, "createTransferEngine: engine on %s: %s", e->listen,
                      ote_status_str(st));
            goto err_mutex;
        }
    }
    return e;
err_mutex:
    e->magic = 0;
    ote_mutex_destroy(&e->mu);
err_free:
    ote_free(e);
    return NULL;
}

int discoverTopology(transfer_engine_t engine) {
    mc_engine_t *e = ote__mc_engine(engine, "discoverTopology");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    /* OrbitTE opens and classifies its devices when the engine is created. */
    return ote__mc_ote(e, "discoverTopology") != NULL ? 0 : OTE_MC_ERR_CONTEXT;
}

int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len) {
    mc_engine_t *e = ote__mc_engine(engine, "getLocalIpAndPort");
    if (e == NULL || buf_out == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    if (ote__mc_ote(e, "getLocalIpAndPort") == NULL) return OTE_MC_ERR_CONTEXT;
    size_t n = strlen(e->address); /* written once, before e->ote was published */
    if (n + 1 > buf_len) {
        OTE_ERROR(MC_LOG, "getLocalIpAndPort: \"%s\" needs %zu bytes, buf_len is %zu", e->address,
                  n + 1, buf_len);
        return OTE_MC_ERR_INVALID_ARGUMENT;
    }
    memcpy(buf_out, e->address, n + 1);
    return 0;
}

transport_t installTransport(transfer_engine_t engine, const char *proto, void **args) {
    (void)args; /* Mooncake's NIC priority matrix: OrbitTE picks NICs itself */
    mc_engine_t *e = ote__mc_engine(engine, "installTransport");
    if (e == NULL) return NULL;
    int which = proto == NULL                ? -1
                : strcmp(proto, "tcp") == 0  ? 0
                : strcmp(proto, "rdma") == 0 ? 1
                                             : -1;
    if (which < 0) {
        OTE_ERROR(MC_LOG, "installTransport: protocol \"%s\" is not one OrbitTE serves (tcp, rdma)",
                  proto ? proto : "(null)");
        return NULL;
    }
    ote_mutex_lock(&e->mu);
    ote_status_t st = e->ote == NULL ? engine_start(e, proto) : OTE_OK;
    char have[sizeof e->transports];
    memcpy(have, e->transports, sizeof have);
    ote_mutex_unlock(&e->mu);
    if (st != OTE_OK) {
        OTE_ERROR(MC_LOG, "installTransport(%s): engine on %s: %s", proto, e->listen,
                  ote_status_str(st));
        return NULL;
    }
    if (strcmp(have + 4, proto) != 0) { /* have is "shm,<proto>" */
        OTE_ERROR(MC_LOG,
                  "installTransport(%s): the engine already serves %s, and an OrbitTE engine's "
                  "transports are fixed when it is created",
                  proto, have);
        return NULL;
    }
    return &e->tp_handle[which];
}

int uninstallTransport(transfer_engine_t engine, const char *proto) {
    mc_engine_t *e = ote__mc_engine(engine, "uninstallTransport");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    OTE_ERROR(MC_LOG,
              "uninstallTransport(%s): not supported: a running OrbitTE engine keeps the "
              "transports it was created with (destroy the engine instead)",
              proto ? proto : "(null)");
    return OTE_MC_ERR_NOT_IMPLEMENTED;
}

void enableGracefulShutdown(transfer_engine_t engine) {
    if (ote__mc_engine(engine, "enableGracefulShutdown") == NULL) return;
    OTE_WARN(MC_LOG,
             "enableGracefulShutdown: not supported: OrbitTE installs no signal handler (a "
             "killed process's peers see its connections close; their requests fail and its "
             "memory is released at once); call destroyTransferEngine on your own shutdown path");
}

void destroyTransferEngine(transfer_engine_t engine) {
    mc_engine_t *e = ote__mc_engine(engine, "destroyTransferEngine");
    if (e == NULL) return;
    ote__mc_batches_free_all(e);
    ote__mc_segs_close_all(e);
    if (e->ote != NULL) {
        ote_status_t st = ote_engine_destroy(e->ote);
        if (st != OTE_OK) {
            /* The engine keeps what it could not destroy; so does this handle (leaked on
             * purpose: freeing it would leave the engine without an owner). */
            OTE_ERROR(MC_LOG, "destroyTransferEngine: the OrbitTE engine at %s is kept: %s",
                      e->address, ote_status_str(st));
            return;
        }
    }
    e->magic = 0;
    ote_free(e->segs);
    ote_free(e->regs);
    ote_free(e->nics);
    ote_mutex_destroy(&e->mu);
    ote_free(e);
}

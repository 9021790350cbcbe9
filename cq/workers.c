/*
 * cq/workers.c - worker threads polling lanes.
 *
 * Each worker holds its own mutex while it touches its lanes (polling, arming, consuming
 * channel events), so removal under that mutex guarantees the worker is done with the
 * lane. The sleep in poll(2) happens without it and is bounded (1 s with channels,
 * 1 ms when some lane has none), and an eventfd wakes a worker for add/remove/stop.
 */
#include <errno.h>
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/thread.h"
#include "cq/cq_internal.h"
#include "cq/workers.h"

#define MAX_WORKERS 64
#define SLEEP_MS_CHANNEL 1000 /* a safety net: an armed channel or the wake fd wakes it */
#define SLEEP_MS_NO_CHANNEL 1

typedef struct worker {
    struct ote_cq_workers *pool;
    uint32_t id;
    pthread_t thread;
    int started;
    int wake_fd;
    ote_mutex_t mu; /* lanes; held while touching them */
    ote_cq_lane_t **lanes;
    size_t nlanes, cap;
} worker_t;

struct ote_cq_workers {
    uint32_t count;
    worker_t *w;
    _Atomic int stop;
    int bound;      /* threads were started on `cpus` */
    cpu_set_t cpus; /* NUMA node's CPUs within the creator's allowed set */
};

/*
 * The CPUs of NUMA node `node` that the calling thread may run on, from the hwloc
 * topology (Debian libhwloc). OTE_ERR_NOT_FOUND when the node does not exist here or
 * none of its CPUs is allowed; the pool then runs unbound. hwloc reports failures as
 * values (libnuma's bitmask helpers exit the process on allocation failure, which a
 * library may not do).
 */
static ote_status_t numa_node_cpus(int node, cpu_set_t *out) {
    ote_status_t st;
    if (ote_fault_hit("cq.workers_numa", &st)) return st;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return ote_status_from_errno(errno);
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return ote_status_from_errno(errno);
    st = OTE_ERR_NOT_FOUND;
    if (hwloc_topology_load(topo) != 0) {
        st = ote_status_from_errno(errno);
        goto out_topo;
    }
    hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(topo, (unsigned)node);
    if (obj == NULL || obj->cpuset == NULL) goto out_topo;
    cpu_set_t node_cpus;
    CPU_ZERO(&node_cpus);
    if (hwloc_cpuset_to_glibc_sched_affinity(topo, obj->cpuset, &node_cpus, sizeof(node_cpus)) !=
        0) {
        st = ote_status_from_errno(errno);
        goto out_topo;
    }
    CPU_AND(out, &node_cpus, &allowed);
    st = CPU_COUNT(out) > 0 ? OTE_OK : OTE_ERR_NOT_FOUND;
out_topo:
    hwloc_topology_destroy(topo);
    return st;
}

static void wake(worker_t *w) {
    uint64_t one = 1;
    ssize_t r = write(w->wake_fd, &one, sizeof(one));
    (void)r; /* a full eventfd counter still wakes the worker */
}

/* Poll every lane once; returns completions dispatched. Caller holds w->mu. */
static int poll_lanes(worker_t *w) {
    int did = 0;
    for (size_t i = 0; i < w->nlanes; i++) {
        ote_cq_lane_t *lane = w->lanes[i];
        ote__cq_lane_poll_lock(lane);
        int n = ote__cq_lane_poll_locked(lane);
        ote__cq_lane_poll_unlock(lane);
        if (n > 0) {
            ote_mutex_lock(&lane->progress_mu);
            lane->progress_epoch++;
            ote_cond_broadcast(&lane->progress_cv);
            ote_mutex_unlock(&lane->progress_mu);
            did += n;
        }
    }
    return did;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    struct pollfd *fds = NULL;
    size_t fds_cap = 0;
    while (!atomic_load(&w->pool->stop)) {
        ote_mutex_lock(&w->mu);
        int did = poll_lanes(w);
        if (did > 0) {
            ote_mutex_unlock(&w->mu);
            continue;
        }
        /* Arm every channel, then poll once more: a CQE that arrived between the empty
         * poll and the arm would not fire the channel. */
        int no_channel = 0;
        for (size_t i = 0; i < w->nlanes; i++) {
            if (ote_cq_lane_channel_fd(w->lanes[i]) < 0) no_channel = 1;
            else if (ote__cq_lane_arm(w->lanes[i]) != 0) no_channel = 1;
        }
        did = poll_lanes(w);
        size_t want = w->nlanes + 1;
        if (want > fds_cap) {
            struct pollfd *nf = ote_realloc(fds, want * sizeof(*fds));
            if (nf != NULL) {
                fds = nf;
                fds_cap = want;
            }
        }
        nfds_t nfds = 0;
        if (fds_cap > 0) {
            fds[nfds].fd = w->wake_fd;
            fds[nfds].events = POLLIN;
            nfds++;
            for (size_t i = 0; i < w->nlanes && nfds < fds_cap; i++) {
                int fd = ote_cq_lane_channel_fd(w->lanes[i]);
                if (fd < 0) continue;
                fds[nfds].fd = fd;
                fds[nfds].events = POLLIN;
                nfds++;
            }
        } else {
            no_channel = 1; /* no memory for the fd set: fall back to short sleeps */
        }
        ote_mutex_unlock(&w->mu);
        if (did > 0) continue;
        int timeout = no_channel ? SLEEP_MS_NO_CHANNEL : SLEEP_MS_CHANNEL;
        if (nfds > 0) {
            if (poll(fds, nfds, timeout) > 0 && (fds[0].revents & POLLIN)) {
                uint64_t cnt;
                ssize_t r = read(w->wake_fd, &cnt, sizeof(cnt));
                (void)r;
            }
        } else {
            (void)poll(NULL, 0, timeout);
        }
        ote_mutex_lock(&w->mu);
        for (size_t i = 0; i < w->nlanes; i++) ote__cq_lane_consume_events(w->lanes[i]);
        ote_mutex_unlock(&w->mu);
    }
    ote_free(fds);
    return NULL;
}

static void free_pool(ote_cq_workers_t *p) {
    for (uint32_t i = 0; i < p->count; i++) {
        worker_t *w = &p->w[i];
        if (w->started) (void)pthread_join(w->thread, NULL);
        if (w->wake_fd >= 0) {
            close(w->wake_fd);
            ote_mutex_destroy(&w->mu);
        }
        ote_free(w->lanes);
    }
    ote_free(p->w);
    ote_free(p);
}

ote_status_t ote_cq_workers_start(uint32_t count, ote_cq_workers_t **workers_out) {
    return ote_cq_workers_start_numa(count, -1, workers_out);
}

ote_status_t ote_cq_workers_start_numa(uint32_t count, int numa_node,
                                       ote_cq_workers_t **workers_out) {
    if (count == 0 || count > MAX_WORKERS || workers_out == NULL || numa_node < -1)
        return OTE_ERR_INVALID;
    ote_status_t st;
    if (ote_fault_hit("cq.workers_start", &st)) return st;
    ote_cq_workers_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    if (numa_node >= 0) {
        st = numa_node_cpus(numa_node, &p->cpus);
        if (st == OTE_OK) {
            p->bound = 1;
            OTE_DEBUG("cq", "worker pool bound to NUMA node %d (%d CPUs)", numa_node,
                      CPU_COUNT(&p->cpus));
        } else {
            /* Placement is an optimisation: a node this machine lacks (or whose CPUs the
             * creator may not use) leaves the pool unbound, and says so. */
            char desc[128];
            OTE_INFO("cq", "worker pool not bound to NUMA node %d: %s", numa_node,
                     ote_status_describe(st, desc, sizeof(desc)));
        }
    }
    p->w = ote_calloc(count, sizeof(*p->w));
    if (p->w == NULL) {
        ote_free(p);
        return OTE_ERR_NOMEM;
    }
    p->count = count;
    for (uint32_t i = 0; i < count; i++) p->w[i].wake_fd = -1;
    st = OTE_OK;
    for (uint32_t i = 0; i < count && st == OTE_OK; i++) {
        worker_t *w = &p->w[i];
        w->pool = p;
        w->id = i;
        int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0) {
            st = ote_status_from_errno(errno);
            break;
        }
        if ((st = ote_mutex_init(&w->mu)) != OTE_OK) {
            close(fd);
            break;
        }
        w->wake_fd = fd;
        /* A bound pool's threads start on their CPUs, before they poll anything. */
        pthread_attr_t attr;
        int err = pthread_attr_init(&attr);
        if (err == 0) {
            if (p->bound) err = pthread_attr_setaffinity_np(&attr, sizeof(p->cpus), &p->cpus);
            if (err == 0) err = ote_thread_create(&w->thread, &attr, worker_main, w);
            pthread_attr_destroy(&attr);
        }
        if (err == 0) {
            char name[16];
            snprintf(name, sizeof(name), "ote-cq-%u", i);
            pthread_setname_np(w->thread, name); /* for top/gdb/tests; failure is harmless */
        }
        if (err != 0) {
            OTE_ERROR("cq", "worker %u: pthread_create failed: errno %d", i, err);
            st = ote_status_from_errno(err);
            break;
        }
        w->started = 1;
    }
    if (st != OTE_OK) {
        atomic_store(&p->stop, 1);
        for (uint32_t i = 0; i < count; i++)
            if (p->w[i].started) wake(&p->w[i]);
        free_pool(p);
        return st;
    }
    *workers_out = p;
    return OTE_OK;
}

ote_status_t ote_cq_workers_stop(ote_cq_workers_t *p) {
    if (p == NULL) return OTE_OK;
    for (uint32_t i = 0; i < p->count; i++) {
        ote_mutex_lock(&p->w[i].mu);
        size_t n = p->w[i].nlanes;
        ote_mutex_unlock(&p->w[i].mu);
        if (n > 0) return OTE_ERR_BUSY;
    }
    atomic_store(&p->stop, 1);
    for (uint32_t i = 0; i < p->count; i++) wake(&p->w[i]);
    free_pool(p);
    return OTE_OK;
}

ote_status_t ote_cq_workers_add(ote_cq_workers_t *p, ote_cq_lane_t *lane) {
    if (p == NULL || lane == NULL) return OTE_ERR_INVALID;
    worker_t *w = &p->w[lane->index % p->count];
    ote_mutex_lock(&lane->table_mu);
    ote_status_t st = lane->in_workers ? OTE_ERR_EXISTS : lane->closing ? OTE_ERR_STATE : OTE_OK;
    if (st == OTE_OK) lane->in_workers = 1;
    ote_mutex_unlock(&lane->table_mu);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&w->mu);
    if (w->nlanes == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4;
        ote_cq_lane_t **nl = ote_realloc(w->lanes, cap * sizeof(*nl));
        if (nl == NULL) {
            st = OTE_ERR_NOMEM;
        } else {
            w->lanes = nl;
            w->cap = cap;
        }
    }
    if (st == OTE_OK) w->lanes[w->nlanes++] = lane;
    ote_mutex_unlock(&w->mu);
    if (st != OTE_OK) {
        ote_mutex_lock(&lane->table_mu);
        lane->in_workers = 0;
        ote_mutex_unlock(&lane->table_mu);
        return st;
    }
    wake(w);
    return OTE_OK;
}

ote_status_t ote_cq_workers_remove(ote_cq_workers_t *p, ote_cq_lane_t *lane) {
    if (p == NULL || lane == NULL) return OTE_ERR_INVALID;
    worker_t *w = &p->w[lane->index % p->count];
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->nlanes; i++) {
        if (w->lanes[i] == lane) {
            w->lanes[i] = w->lanes[--w->nlanes];
            st = OTE_OK;
            break;
        }
    }
    ote_mutex_unlock(&w->mu);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&lane->table_mu);
    lane->in_workers = 0;
    ote_mutex_unlock(&lane->table_mu);
    wake(w);
    return OTE_OK;
}

ote_status_t ote_cq_workers_cpus(const ote_cq_workers_t *p, cpu_set_t *cpus_out) {
    if (p == NULL || cpus_out == NULL) return OTE_ERR_INVALID;
    if (!p->bound) return OTE_ERR_NOT_FOUND;
    *cpus_out = p->cpus;
    return OTE_OK;
}

uint32_t ote_cq_workers_count(const ote_cq_workers_t *p) { return p->count; }

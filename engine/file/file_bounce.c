/*
 * engine/file/file_bounce.c - the pool of bounce buffers through which a transport's
 * source serves file registrations to peers (host->file's bounce_get / bounce_put): 4 KiB-
 * aligned buffers, so that an aligned slice goes O_DIRECT, in power-of-two size classes
 * from 4 KiB to 64 MiB, reused instead of an allocation per slice. The first
 * OTE__FILE_BOUNCE_KEEP buffers made in a class are kept: given back, they wait in the
 * pool for the next slice, and only ote__fbpool_fini (the file owner's destroy, after the
 * transports') frees them, so that the RDMA source registers an MR over each once per
 * device and keeps it (host->file.bounce_kept). A buffer made while a class's kept ones
 * are all out is a spare: given back, it waits on a list of its own (up to
 * OTE__FILE_BOUNCE_KEEP free ones per class, the others freed), is never reported kept,
 * and is taken only when no kept one is free. One over the largest class serves its
 * slice alone and is freed when given back. A pooled buffer is registered with the I/O
 * engine's ring as a fixed buffer when made (ote__fio_buf_add; refused: a plain one), its
 * slot emptied before it is freed. Thread-safe: sources of several workers share it.
 */

#include "base/alloc.h"
#include "engine/file/file_internal.h"

/* The class of len (its capacity 4 KiB << class), or -1 over the largest. */
static int bounce_class(uint32_t len) {
    uint64_t cap = OTE__FILE_DIO_ALIGN;
    for (int c = 0; c < OTE__FILE_BOUNCE_CLASSES; c++, cap <<= 1)
        if (len <= cap) return c;
    return -1;
}

ote_status_t ote__fbpool_init(ote__fbpool_t *p) {
    for (int c = 0; c < OTE__FILE_BOUNCE_CLASSES; c++) {
        p->free[c] = NULL;
        p->spare[c] = NULL;
        p->nspare[c] = 0;
        p->nkept[c] = 0;
    }
    return ote_mutex_init(&p->mu);
}

static void fbuf_free(ote__fbuf_t *b, ote__fio_t *io) {
    ote__fio_buf_remove(io, b->fixbuf); /* before its memory goes */
    ote_aligned_free(b->data);
    ote_free(b);
}

static void free_list(ote__fbuf_t **l) {
    while (*l != NULL) {
        ote__fbuf_t *b = *l;
        *l = b->next;
        fbuf_free(b, NULL); /* the I/O engine is gone, its ring's table with it */
    }
}

void ote__fbpool_fini(ote__fbpool_t *p) {
    for (int c = 0; c < OTE__FILE_BOUNCE_CLASSES; c++) {
        free_list(&p->free[c]);
        free_list(&p->spare[c]);
        p->nspare[c] = 0;
        p->nkept[c] = 0;
    }
    ote_mutex_destroy(&p->mu);
}

ote__fbuf_t *ote__fbpool_get(ote__fbpool_t *p, uint32_t len, ote__fio_t *io) {
    int c = bounce_class(len);
    ote__fbuf_t *b = NULL;
    if (c >= 0) {
        ote_mutex_lock(&p->mu);
        b = p->free[c];
        if (b != NULL) {
            p->free[c] = b->next;
        } else if ((b = p->spare[c]) != NULL) {
            p->spare[c] = b->next;
            p->nspare[c]--;
        }
        ote_mutex_unlock(&p->mu);
        if (b != NULL) return b;
    }
    uint64_t cap = c >= 0 ? (uint64_t)OTE__FILE_DIO_ALIGN << c
                          : ((uint64_t)len + OTE__FILE_DIO_ALIGN - 1) / OTE__FILE_DIO_ALIGN *
                                OTE__FILE_DIO_ALIGN;
    b = ote_calloc(1, sizeof(*b));
    if (b == NULL) return NULL;
    b->data = ote_aligned_alloc(OTE__FILE_DIO_ALIGN, (size_t)cap);
    if (b->data == NULL) {
        ote_free(b);
        return NULL;
    }
    b->cls = c;
    b->cap = cap;
    if (c >= 0) {
        ote_mutex_lock(&p->mu);
        if (p->nkept[c] < OTE__FILE_BOUNCE_KEEP) {
            p->nkept[c]++;
            b->kept = 1;
        }
        ote_mutex_unlock(&p->mu);
    }
    b->fixbuf = c >= 0 ? ote__fio_buf_add(io, b->data, (size_t)cap) : -1; /* pooled ones */
    return b;
}

void ote__fbpool_put(ote__fbpool_t *p, ote__fbuf_t *b, ote__fio_t *io) {
    if (b->cls >= 0) {
        ote_mutex_lock(&p->mu);
        b->reg = NULL;
        if (b->kept) {
            b->next = p->free[b->cls];
            p->free[b->cls] = b;
            b = NULL;
        } else if (p->nspare[b->cls] < OTE__FILE_BOUNCE_KEEP) {
            b->next = p->spare[b->cls];
            p->spare[b->cls] = b;
            p->nspare[b->cls]++;
            b = NULL;
        }
        ote_mutex_unlock(&p->mu);
    }
    if (b != NULL) fbuf_free(b, io);
}

int ote__fbpool_kept(const ote__fbuf_t *b, uint8_t **base_out, uint64_t *size_out) {
    if (!b->kept) return 0;
    *base_out = b->data;
    *size_out = b->cap;
    return 1;
}

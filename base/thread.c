#include "base/thread.h"

#include <errno.h>

#include "base/alloc.h"
#include "base/log.h"

typedef struct {
    void *(*fn)(void *);
    void *arg;
    const char *engine;
} start_t;

static void *start_main(void *p) {
    start_t s = *(start_t *)p;
    ote_free(p);
    ote_log_set_thread_engine(s.engine);
    return s.fn(s.arg);
}

int ote_thread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    start_t *s = ote_malloc(sizeof(*s));
    if (s == NULL) return ENOMEM;
    s->fn = fn;
    s->arg = arg;
    s->engine = ote_log_thread_engine();
    int rc = pthread_create(th, attr, start_main, s);
    if (rc != 0) ote_free(s);
    return rc;
}

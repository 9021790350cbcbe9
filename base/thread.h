/*
 * base/thread.h - starting the library's threads.
 *
 * ote_thread_create is pthread_create that also hands the creating thread's engine log
 * tag (base/log.h, ote_log_set_thread_engine) to the new thread, so that a worker,
 * listener or progress thread an engine starts writes lines that name that engine.
 * Every thread the engine starts goes through it.
 */
#ifndef OTE_BASE_THREAD_H
#define OTE_BASE_THREAD_H

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/* As pthread_create: 0, or the errno value (ENOMEM when the hand-over record cannot be
 * allocated; nothing started then). The tag string must outlive the thread (an engine's
 * tag lives as long as the engine, which joins its threads or is retained). */
int ote_thread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

#ifdef __cplusplus
}
#endif
#endif

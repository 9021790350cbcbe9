/*
 * verbs/sim/sim.c - entry point of the software RC provider (placeholder while the
 * provider is being written; returns OTE_ERR_UNSUPPORTED).
 */
#include "verbs/provider.h"

ote_status_t ote__verbs_sim_open(const char *config, ote_verbs_t **v_out) {
    (void)config;
    (void)v_out;
    return OTE_ERR_UNSUPPORTED;
}

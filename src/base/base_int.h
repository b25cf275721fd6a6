/*-------------------------------------------------------------------------
 *
 * base_int.h
 *	  What the files of base/ share, and no other subsystem sees (its
 *	  public header is base/base.h).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/base/base_int.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_BASE_INT_H
#define RL_BASE_INT_H

#include "base/base.h"

/*
 * rl_parse_url's detail for a URL that carries a password; the settings'
 * check hooks compare the detail they get with it by address.
 */
extern const char *const rl_url_password_msg;

#endif							/* RL_BASE_INT_H */

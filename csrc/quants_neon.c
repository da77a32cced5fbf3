/* quants_neon.c — placeholder */
#include "quants.h"
int pl_install_quants_neon(void) { return 0; }

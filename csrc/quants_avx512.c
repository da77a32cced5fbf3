/* quants_avx512.c — placeholder */
#include "quants.h"
int pl_install_quants_avx512(void) { return pl_install_quants_avx2(); }

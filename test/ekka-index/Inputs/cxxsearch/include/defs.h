#define A_KERNEL old_a

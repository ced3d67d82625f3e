#define B_KERNEL old_b

/*
 * kb_par — fork-join over work items (kb_par.h).
 */
#include "kb_par.h"

#include <pthread.h>

void kb_par_run(void *(*fn)(void *), void *items, size_t size, size_t n)
{
    char *base = items;
    pthread_t th[KB_PAR_MAX];
    int started[KB_PAR_MAX];

    for (size_t at = 0; at < n; at += KB_PAR_MAX) {
        size_t k = n - at < KB_PAR_MAX ? n - at : KB_PAR_MAX;
        for (size_t i = 1; i < k; i++)
            started[i] = pthread_create(&th[i], NULL, fn, base + (at + i) * size) == 0;
        fn(base + at * size);
        for (size_t i = 1; i < k; i++) {
            if (started[i])
                pthread_join(th[i], NULL);
            else
                fn(base + (at + i) * size);
        }
    }
}

/* The C floor for a scrape: open, read, close and parse the same cgroup files the agent exports, as a
 * program that does nothing else would. benchmarks/run.py builds it with gcc and runs it on the same tree.
 *
 *   floor PATHS_FILE PASSES   → prints the median CPU nanoseconds of one pass over every path
 *
 * PATHS_FILE holds one file path per line (memory.events, memory.max, memory.current, memory.oom.group,
 * memory.peak of every workload cgroup). Each value is parsed (strtoull, "max" as the largest value) and
 * summed, so the reads cannot be optimised away. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static unsigned long long parse(char *buf) {
    /* "123\n", "max\n", or "key value\n" lines: sum every number. */
    unsigned long long sum = 0;
    char *p = buf;
    while (*p) {
        char *line_end = strchr(p, '\n');
        if (line_end) *line_end = 0;
        char *space = strchr(p, ' ');
        char *num = space ? space + 1 : p;
        if (strncmp(num, "max", 3) == 0) sum += ~0ULL >> 1;
        else sum += strtoull(num, NULL, 10);
        if (!line_end) break;
        p = line_end + 1;
    }
    return sum;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PATHS_FILE PASSES\n", argv[0]);
        return 2;
    }
    FILE *list = fopen(argv[1], "r");
    if (!list) { perror(argv[1]); return 1; }
    size_t cap = 1024, n = 0;
    char **paths = malloc(cap * sizeof *paths);
    char line[4096];
    while (fgets(line, sizeof line, list)) {
        line[strcspn(line, "\n")] = 0;
        if (n == cap) paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[n++] = strdup(line);
    }
    fclose(list);
    int passes = atoi(argv[2]);
    long long *times = malloc(passes * sizeof *times);
    unsigned long long total = 0;
    char buf[4097];
    for (int pass = 0; pass < passes; pass++) {
        long long t0 = cpu_ns();
        for (size_t i = 0; i < n; i++) {
            int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            ssize_t got = read(fd, buf, 4096);
            close(fd);
            if (got <= 0) continue;
            buf[got] = 0;
            total += parse(buf);
        }
        times[pass] = cpu_ns() - t0;
    }
    qsort(times, passes, sizeof *times, cmp);
    printf("%lld %zu %llu\n", times[passes / 2], n, total);
    return 0;
}

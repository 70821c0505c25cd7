/* The floor of OOM-kill detection latency (issue 30): the least a watcher can do to see a kill. Blocked in poll()
 * on /dev/kmsg (opened at its end) and on inotify of each given memory.events file, it writes one line for each
 * OOM record the moment it reads it, and one for each change of a watched file's oom_kill or oom_group_kill,
 * with CLOCK_REALTIME, the clock the agent stamps `detected_at` with. Run beside the agent in the same guest;
 * the storm tier compares the agent's publish times with this program's first sight of each kill.
 *
 *   oomfloor OUT MEMORY_EVENTS...      (SIGTERM ends it; every line is written with one write(2))
 *
 * Lines:  kmsg SEQ REALTIME_NS USEC TEXT_PREFIX      (records with "Killed process", "oom-kill:", "invoked
 *                                                    oom-killer" or "Tasks in")
 *         events INDEX REALTIME_NS OOM_KILL OOM_GROUP_KILL
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_term(int sig) { (void)sig; stop = 1; }

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long field(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? atoll(p + strlen(key)) : -1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: oomfloor OUT [MEMORY_EVENTS...]\n");
        return 2;
    }
    int out = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    int kmsg = open("/dev/kmsg", O_RDONLY | O_NONBLOCK);
    int ino = inotify_init1(IN_NONBLOCK);
    if (out < 0 || kmsg < 0 || ino < 0) {
        perror("oomfloor: open");
        return 1;
    }
    lseek(kmsg, 0, SEEK_END);
    int n = argc - 2;
    int *wd = calloc(n > 0 ? n : 1, sizeof(int));
    long long *last = calloc(n > 0 ? 2 * n : 2, sizeof(long long));
    for (int i = 0; i < n; i++) {
        wd[i] = inotify_add_watch(ino, argv[i + 2], IN_MODIFY);
        last[2 * i] = last[2 * i + 1] = -1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    struct pollfd fds[2] = {{kmsg, POLLIN, 0}, {ino, POLLIN, 0}};
    char rec[8192], line[512], file[256];
    char ev[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    while (!stop) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        long long t = now_ns();
        for (;;) {  /* every record there now: one read() is one record */
            ssize_t len = read(kmsg, rec, sizeof rec - 1);
            if (len < 0) {
                if (errno == EPIPE) continue;  /* overwritten: go on with the next */
                break;
            }
            rec[len] = 0;
            char *text = strchr(rec, ';');
            if (!text) continue;
            text++;
            if (!strstr(text, "Killed process") && !strstr(text, "oom-kill:") &&
                !strstr(text, "invoked oom-killer") && !strstr(text, "Tasks in ")) continue;
            long long seq = -1, usec = -1;
            sscanf(rec, "%*d,%lld,%lld", &seq, &usec);
            char *nl = strchr(text, '\n');
            if (nl) *nl = 0;
            int k = snprintf(line, sizeof line, "kmsg %lld %lld %lld %.160s\n", seq, t, usec, text);
            if (write(out, line, k > (int)sizeof line ? (int)sizeof line : k) < 0) return 1;
        }
        for (;;) {
            ssize_t len = read(ino, ev, sizeof ev);
            if (len <= 0) break;
            for (char *p = ev; p < ev + len;) {
                struct inotify_event *e = (struct inotify_event *)p;
                p += sizeof *e + e->len;
                for (int i = 0; i < n; i++) {
                    if (wd[i] != e->wd) continue;
                    int fd = open(argv[i + 2], O_RDONLY);
                    if (fd < 0) break;
                    ssize_t got = read(fd, file, sizeof file - 1);
                    close(fd);
                    if (got <= 0) break;
                    file[got] = 0;
                    long long kill = field(file, "\noom_kill "), group = field(file, "oom_group_kill ");
                    if (kill == last[2 * i] && group == last[2 * i + 1]) break;
                    last[2 * i] = kill;
                    last[2 * i + 1] = group;
                    int k = snprintf(line, sizeof line, "events %d %lld %lld %lld\n", i, t, kill, group);
                    if (write(out, line, k) < 0) return 1;
                    break;
                }
            }
        }
    }
    return 0;
}

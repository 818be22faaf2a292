// Curator's own InterProcessSemaphoreV2 or LeaderSelector, driven line by
// line by lockkit-testkit's CuratorPeer (interop tests and benchmarks).
//
//   java CuratorPeer <connect string> <path> <permits>
//   java CuratorPeer <connect string> <path> leader <participant id>
//
// Commands on stdin, one answer line each on stdout:
//   try      take a lease without waiting: "acquired" (held) or "busy"
//   return   return the held lease: "returned" ("none" if none is held)
//   cycle    acquire (waiting up to 10 s) and return a lease: the nanoseconds
//            the pair took, measured here, or "busy"
//
// LeaderSelector commands:
//   run           start campaigning: "campaigning"
//   leading       "yes" while this participant leads, else "no"
//   leader        the leader's id (getLeader()), "none" when nobody leads
//   participants  the participants' ids in order, comma separated
//   resign        give up the leadership (takeLeadership returns): "resigned"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String path = args[1];
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(connect, 10_000, 5_000, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(5, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected to " + connect);
            }
            if (args[2].equals("leader")) {
                leader(client, path, args[3]);
                return;
            }
            int permits = Integer.parseInt(args[2]);
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, permits);
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            System.out.println("ready");
            System.out.flush();
            Lease held = null;
            for (String line; (line = in.readLine()) != null; ) {
                switch (line.trim()) {
                    case "try": {
                        Lease lease = semaphore.acquire(0, TimeUnit.MILLISECONDS);
                        if (lease != null) {
                            held = lease;
                        }
                        System.out.println(lease == null ? "busy" : "acquired");
                        break;
                    }
                    case "return": {
                        if (held == null) {
                            System.out.println("none");
                        } else {
                            semaphore.returnLease(held);
                            held = null;
                            System.out.println("returned");
                        }
                        break;
                    }
                    case "cycle": {
                        long started = System.nanoTime();
                        Lease lease = semaphore.acquire(10, TimeUnit.SECONDS);
                        if (lease == null) {
                            System.out.println("busy");
                        } else {
                            semaphore.returnLease(lease);
                            System.out.println(System.nanoTime() - started);
                        }
                        break;
                    }
                    default:
                        System.out.println("unknown command: " + line);
                }
                System.out.flush();
            }
        }
    }

    static void leader(CuratorFramework client, String path, String id) throws Exception {
        AtomicBoolean leading = new AtomicBoolean(false);
        CountDownLatch stop = new CountDownLatch(1);
        LeaderSelector selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework c) throws Exception {
                leading.set(true);
                try {
                    stop.await();
                } finally {
                    leading.set(false);
                }
            }
        });
        selector.setId(id);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("ready");
        System.out.flush();
        for (String line; (line = in.readLine()) != null; ) {
            switch (line.trim()) {
                case "run":
                    selector.start();
                    System.out.println("campaigning");
                    break;
                case "leading":
                    System.out.println(leading.get() ? "yes" : "no");
                    break;
                case "leader": {
                    Participant leader = selector.getLeader();
                    System.out.println(leader.isLeader() ? leader.getId() : "none");
                    break;
                }
                case "participants": {
                    List<String> ids = new ArrayList<>();
                    for (Participant p : selector.getParticipants()) {
                        ids.add(p.getId());
                    }
                    System.out.println(String.join(",", ids));
                    break;
                }
                case "resign": {
                    stop.countDown();
                    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                    while (leading.get() && System.nanoTime() < deadline) {
                        Thread.sleep(10);
                    }
                    System.out.println("resigned");
                    break;
                }
                default:
                    System.out.println("unknown command: " + line);
            }
            System.out.flush();
        }
        selector.close();
    }
}

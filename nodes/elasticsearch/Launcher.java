/*
 * Minimal launcher for a real Elasticsearch 8.x node built from Maven Central jars only
 * (server + transport-netty4 + their dependencies, see pom.xml in this directory).
 *
 *   mvn -q -s nodes/maven-settings.xml -f engines/elasticsearch/pom.xml -Dengine.lib=LIB generate-resources
 *   javac -cp 'LIB/*' -d CLASSES engines/elasticsearch/Launcher.java
 *   java -Xms512m -Xmx512m -cp 'CLASSES:LIB/*' Launcher path.home=/tmp/es1 http.port=9250 \
 *        transport.port=9350 network.host=127.0.0.1 discovery.type=single-node
 *
 * Every argument key=value becomes a node setting (path.home is required). Plugins: every
 * LIB/modules/NAME/ directory (LIB = the directory of the server jar, or -Dlauncher.modules=PATH)
 * is installed as module NAME under path.home/modules (transport-netty4: HTTP + transport).
 * Logging: log4j console (stderr) at WARN; override with the setting logger.level=INFO etc.
 * SIGTERM / SIGINT close the node and exit 0. A start error prints "error: <message>" on
 * stderr, then the stack trace, and exits 1.
 */

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;

import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.core.appender.ConsoleAppender;
import org.apache.logging.log4j.core.config.Configurator;
import org.apache.logging.log4j.core.config.builder.api.ConfigurationBuilder;
import org.apache.logging.log4j.core.config.builder.api.ConfigurationBuilderFactory;
import org.apache.logging.log4j.core.config.builder.impl.BuiltConfiguration;
import org.elasticsearch.Build;
import org.elasticsearch.client.internal.node.NodeClient;
import org.elasticsearch.cluster.service.ClusterService;
import org.elasticsearch.common.bytes.BytesArray;
import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.node.InternalSettingsPreparer;
import org.elasticsearch.node.Node;
import org.elasticsearch.plugins.PluginBundle;
import org.elasticsearch.plugins.PluginsLoader;
import org.elasticsearch.rest.RestChannel;
import org.elasticsearch.rest.RestController;
import org.elasticsearch.rest.RestHandler;
import org.elasticsearch.rest.RestRequest;
import org.elasticsearch.rest.RestResponse;
import org.elasticsearch.rest.RestStatus;
import org.elasticsearch.xcontent.XContentBuilder;

public final class Launcher {

    private static final String DESCRIPTOR_PREFIX = "META-INF/es-plugins/";
    private static final String DESCRIPTOR_NAME = "plugin-descriptor.properties";

    private static volatile Node node;
    private static final CountDownLatch stopped = new CountDownLatch(1);

    public static void main(String[] args) {
        // Same JVM-wide switches the official launcher sets; must precede any log4j use.
        System.setProperty("log4j.shutdownHookEnabled", "false");
        System.setProperty("log4j2.disable.jmx", "true");
        System.setProperty("log4j2.formatMsgNoLookups", "true");
        try {
            watchParent();
            Settings settings = parseArgs(args);
            configureLogging(settings.get("logger.level", "WARN"));
            start(settings);
        } catch (Throwable t) {
            String msg = t.getMessage() == null ? t.toString() : t.getMessage();
            System.err.println("error: " + msg.replace('\n', ' '));
            t.printStackTrace();
            Node n = node;
            if (n != null) {
                try {
                    n.close();
                } catch (Throwable ignored) {
                    // exiting anyway
                }
            }
            System.err.flush();
            Runtime.getRuntime().halt(1);
        }
        try {
            stopped.await();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
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

    private static Settings parseArgs(String[] args) {
        Settings.Builder b = Settings.builder();
        for (String arg : args) {
            int eq = arg.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("argument [" + arg + "] is not key=value");
            }
            b.put(arg.substring(0, eq).trim(), arg.substring(eq + 1).trim());
        }
        Settings s = b.build();
        if (s.get("path.home") == null) {
            throw new IllegalArgumentException("path.home=<dir> is required");
        }
        return s;
    }

    private static void configureLogging(String level) {
        ConfigurationBuilder<BuiltConfiguration> cb = ConfigurationBuilderFactory.newConfigurationBuilder();
        cb.setStatusLevel(Level.ERROR);
        cb.setConfigurationName("launcher");
        cb.add(
            cb.newAppender("console", "Console")
                .addAttribute("target", ConsoleAppender.Target.SYSTEM_ERR)
                .add(cb.newLayout("PatternLayout").addAttribute("pattern", "[%d{ISO8601}][%-5p][%c{1.}] %m%n"))
        );
        cb.add(cb.newRootLogger(Level.toLevel(level.toUpperCase(Locale.ROOT), Level.WARN)).add(cb.newAppenderRef("console")));
        Configurator.reconfigure(cb.build());
        LogConfigurator.configureESLogging();
    }

    private static void start(Settings settings) throws Exception {
        Path home = Paths.get(settings.get("path.home")).toAbsolutePath();
        Files.createDirectories(home.resolve("config"));
        Path modules = home.resolve("modules");
        prepareModules(findModulesSource(), modules);

        Environment env = InternalSettingsPreparer.prepareEnvironment(
            Settings.builder().put(settings).put("path.home", home.toString()).build(),
            Map.of(),
            home.resolve("config"),
            () -> "node-" + settings.get("http.port", "0")
        );
        Set<PluginBundle> moduleBundles = PluginsLoader.loadModulesBundles(modules);
        PluginsLoader pluginsLoader = PluginsLoader.createPluginsLoader(moduleBundles, Set.of(), Map.of(), false); // false: no server module exports (classpath, unnamed module)

        Node n = new Node(env, pluginsLoader);
        node = n;
        registerRootHandler(n);
        Runtime.getRuntime().addShutdownHook(new Thread(Launcher::shutdown, "launcher-shutdown"));
        installSignalHandlers();
        n.start();
        System.err.println(
            "started: elasticsearch " + Build.current().version() + " node [" + env.settings().get("node.name", "") + "]"
        );
    }

    /**
     * GET / (and HEAD /) normally come from the rest-root module, which is not published to Maven Central:
     * serve the same body (name, cluster_name, cluster_uuid, version{...}, tagline) from here.
     */
    private static void registerRootHandler(Node n) {
        RestController rest = n.injector().getInstance(RestController.class);
        ClusterService clusterService = n.injector().getInstance(ClusterService.class);
        RestHandler handler = new RestHandler() {
            @Override
            public List<Route> routes() {
                return List.of(new Route(RestRequest.Method.GET, "/"), new Route(RestRequest.Method.HEAD, "/"));
            }

            @Override
            public String getName() {
                return "launcher_main_action";
            }

            @Override
            public void handleRequest(RestRequest request, RestChannel channel, NodeClient client) throws Exception {
                if (request.method() == RestRequest.Method.HEAD) {
                    channel.sendResponse(new RestResponse(RestStatus.OK, "application/json", BytesArray.EMPTY));
                    return;
                }
                Build build = Build.current();
                XContentBuilder b = channel.newBuilder();
                b.startObject();
                b.field("name", clusterService.getNodeName());
                b.field("cluster_name", clusterService.getClusterName().value());
                b.field("cluster_uuid", clusterService.state().metadata().clusterUUID());
                b.startObject("version");
                b.field("number", build.qualifiedVersion());
                b.field("build_flavor", build.flavor());
                b.field("build_type", build.type().displayName());
                b.field("build_hash", build.hash());
                b.field("build_date", build.date());
                b.field("build_snapshot", build.isSnapshot());
                b.field("lucene_version", org.apache.lucene.util.Version.LATEST.toString());
                b.field("minimum_wire_compatibility_version", build.minWireCompatVersion());
                b.field("minimum_index_compatibility_version", build.minIndexCompatVersion());
                b.endObject();
                b.field("tagline", "You Know, for Search");
                b.endObject();
                channel.sendResponse(new RestResponse(RestStatus.OK, b));
            }
        };
        rest.registerHandler(handler);
    }

    /** SIGTERM/SIGINT: leave through System.exit(0) so the shutdown hook closes the node and the exit code is 0. */
    @SuppressWarnings("removal")
    private static void installSignalHandlers() {
        for (String sig : new String[] { "TERM", "INT" }) {
            try {
                sun.misc.Signal.handle(new sun.misc.Signal(sig), s -> new Thread(() -> System.exit(0), "launcher-exit").start());
            } catch (Throwable ignored) {
                // default JVM handling (shutdown hook still runs)
            }
        }
    }

    private static void shutdown() {
        Node n = node;
        if (n != null) {
            try {
                n.close();
                n.awaitClose(30, TimeUnit.SECONDS);
            } catch (Throwable t) {
                System.err.println("error: closing node: " + t);
            }
        }
        stopped.countDown();
        System.err.println("stopped");
        System.err.flush();
    }

    /** DIR/modules where DIR holds the server jar (the pom's layout), or -Dlauncher.modules=PATH. */
    private static Path findModulesSource() throws Exception {
        String prop = System.getProperty("launcher.modules");
        if (prop != null) {
            return Paths.get(prop).toAbsolutePath();
        }
        Path serverJar = Paths.get(Node.class.getProtectionDomain().getCodeSource().getLocation().toURI());
        return serverJar.getParent().resolve("modules");
    }

    /**
     * For every SRC/NAME/ holding jars, builds HOME/modules/NAME/ = copies of those jars + the
     * plugin-descriptor.properties embedded in one of them (META-INF/es-plugins/NAME/), minus its
     * modulename: ES then loads the plugin non-modularly through a URLClassLoader over these jars whose
     * parent is the application class loader (server, netty, ... on the classpath).
     */
    private static void prepareModules(Path source, Path target) throws IOException {
        if (Files.isDirectory(source) == false) {
            throw new IllegalStateException("plugin modules directory [" + source + "] not found (transport-netty4 expected there)");
        }
        Files.createDirectories(target);
        int found = 0;
        try (DirectoryStream<Path> dirs = Files.newDirectoryStream(source)) {
            for (Path src : dirs) {
                if (Files.isDirectory(src) == false) {
                    continue;
                }
                String plugin = src.getFileName().toString();
                String descriptorEntry = DESCRIPTOR_PREFIX + plugin + "/" + DESCRIPTOR_NAME;
                Path dst = target.resolve(plugin);
                Files.createDirectories(dst);
                Properties descriptor = null;
                try (DirectoryStream<Path> jars = Files.newDirectoryStream(src, "*.jar")) {
                    for (Path jar : jars) {
                        Files.copy(jar, dst.resolve(jar.getFileName()), StandardCopyOption.REPLACE_EXISTING);
                        try (JarFile jf = new JarFile(jar.toFile())) {
                            JarEntry je = jf.getJarEntry(descriptorEntry);
                            if (je != null) {
                                descriptor = new Properties();
                                try (InputStream in = jf.getInputStream(je)) {
                                    descriptor.load(in);
                                }
                            }
                        }
                    }
                }
                if (descriptor == null) {
                    throw new IllegalStateException("no " + descriptorEntry + " in the jars of " + src);
                }
                descriptor.remove("modulename");
                try (OutputStream out = Files.newOutputStream(dst.resolve(DESCRIPTOR_NAME))) {
                    descriptor.store(out, "generated by Launcher from " + src);
                }
                found++;
            }
        }
        if (found == 0) {
            throw new IllegalStateException("no plugin module under [" + source + "]");
        }
    }
}

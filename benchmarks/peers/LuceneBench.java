import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.apache.lucene.analysis.core.WhitespaceAnalyzer;
import org.apache.lucene.document.Document;
import org.apache.lucene.document.Field;
import org.apache.lucene.document.FieldType;
import org.apache.lucene.document.StoredField;
import org.apache.lucene.document.StringField;
import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.IndexOptions;
import org.apache.lucene.index.IndexWriter;
import org.apache.lucene.index.IndexWriterConfig;
import org.apache.lucene.index.StoredFields;
import org.apache.lucene.index.Term;
import org.apache.lucene.search.BooleanClause;
import org.apache.lucene.search.BooleanQuery;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.TermQuery;
import org.apache.lucene.search.TopDocs;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.FSDirectory;

/**
 * The Lucene side of benchmarks/bench_peers.py: it indexes the project's own pre-analysed terms and
 * times top-k BM25 queries over them, so that both engines rank the same strings.
 *
 * <pre>
 * java LuceneBench version                        Lucene's version
 * java LuceneBench index INDEX_DIR DOCS_TSV       one line a doc: id, title, text, unigrams, bigrams
 * java LuceneBench search INDEX_DIR QUERIES_TSV K WARM_PASSES OUT_TSV
 * </pre>
 *
 * Tabs, newlines and backslashes inside a field arrive escaped as \t, \n and \\. A query line holds its
 * unigrams and bigrams, space-separated; each output line holds the query's wall-clock and thread-CPU
 * nanoseconds (building the query, the search, reading the hits' stored ids) and its ids.
 */
public class LuceneBench {
  static final BM25Similarity BM25 = new BM25Similarity(1.2f, 0.75f);

  public static void main(String[] args) throws Exception {
    if (args.length == 1 && args[0].equals("version")) {
      System.out.println(org.apache.lucene.util.Version.LATEST);
    } else if (args.length == 3 && args[0].equals("index")) {
      index(Paths.get(args[1]), Paths.get(args[2]));
    } else if (args.length == 6 && args[0].equals("search")) {
      search(
          Paths.get(args[1]),
          Paths.get(args[2]),
          Integer.parseInt(args[3]),
          Integer.parseInt(args[4]),
          Paths.get(args[5]));
    } else {
      System.err.println("usage: LuceneBench version | index DIR DOCS | search DIR QUERIES K WARM OUT");
      System.exit(2);
    }
  }

  static void index(Path dir, Path docs) throws Exception {
    // Term frequencies and norms, no positions: what BM25 reads, as in the project's tantivy fields.
    FieldType terms = new FieldType();
    terms.setTokenized(true);
    terms.setIndexOptions(IndexOptions.DOCS_AND_FREQS);
    terms.freeze();
    IndexWriterConfig config = new IndexWriterConfig(new WhitespaceAnalyzer());
    config.setSimilarity(BM25);
    config.setOpenMode(IndexWriterConfig.OpenMode.CREATE);
    config.setRAMBufferSizeMB(256);
    // Separate files rather than compound ones, so the stored text's bytes can be told apart.
    config.setUseCompoundFile(false);
    config.getMergePolicy().setNoCFSRatio(0.0);
    long count = 0;
    try (IndexWriter writer = new IndexWriter(FSDirectory.open(dir), config);
        BufferedReader in = Files.newBufferedReader(docs, StandardCharsets.UTF_8)) {
      for (String line = in.readLine(); line != null; line = in.readLine()) {
        String[] f = line.split("\t", -1);
        Document doc = new Document();
        doc.add(new StringField("id", f[0], Field.Store.YES));
        doc.add(new StoredField("title", unescape(f[1])));
        doc.add(new StoredField("text", unescape(f[2])));
        doc.add(new Field("unigrams", f[3], terms));
        doc.add(new Field("bigrams", f[4], terms));
        writer.addDocument(doc);
        count++;
      }
      writer.commit();
    }
    try (DirectoryReader reader = DirectoryReader.open(FSDirectory.open(dir))) {
      System.out.println(count + "\t" + reader.leaves().size());
    }
  }

  static void search(Path dir, Path queries, int k, int warm, Path out) throws Exception {
    List<String[]> qs = new ArrayList<>();
    for (String line : Files.readAllLines(queries, StandardCharsets.UTF_8)) {
      qs.add(line.split("\t", -1));
    }
    try (DirectoryReader reader = DirectoryReader.open(FSDirectory.open(dir))) {
      IndexSearcher searcher = new IndexSearcher(reader);
      searcher.setSimilarity(BM25);
      for (int pass = 0; pass < warm; pass++) {
        for (String[] q : qs) {
          run(searcher, q, k);
        }
      }
      ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
      try (BufferedWriter w = Files.newBufferedWriter(out, StandardCharsets.UTF_8)) {
        for (String[] q : qs) {
          long c0 = cpu.getCurrentThreadCpuTime();
          long t0 = System.nanoTime();
          List<String> ids = run(searcher, q, k);
          long ns = System.nanoTime() - t0;
          long cpuNs = cpu.getCurrentThreadCpuTime() - c0;
          w.write(ns + "\t" + cpuNs + "\t" + String.join(" ", ids) + "\n");
        }
      }
    }
  }

  static List<String> run(IndexSearcher searcher, String[] q, int k) throws Exception {
    BooleanQuery.Builder b = new BooleanQuery.Builder();
    add(b, "unigrams", q[0]);
    add(b, "bigrams", q.length > 1 ? q[1] : "");
    TopDocs top = searcher.search(b.build(), k);
    StoredFields stored = searcher.storedFields();
    List<String> ids = new ArrayList<>();
    for (ScoreDoc hit : top.scoreDocs) {
      ids.add(stored.document(hit.doc, Set.of("id")).get("id"));
    }
    return ids;
  }

  static void add(BooleanQuery.Builder b, String field, String terms) {
    for (String t : terms.split(" ")) {
      if (!t.isEmpty()) {
        b.add(new TermQuery(new Term(field, t)), BooleanClause.Occur.SHOULD);
      }
    }
  }

  static String unescape(String s) {
    if (s.indexOf('\\') < 0) {
      return s;
    }
    StringBuilder out = new StringBuilder(s.length());
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '\\' && i + 1 < s.length()) {
        char n = s.charAt(++i);
        out.append(n == 'n' ? '\n' : n == 't' ? '\t' : n);
      } else {
        out.append(c);
      }
    }
    return out.toString();
  }
}
